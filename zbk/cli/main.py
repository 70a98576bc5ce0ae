"""`zbk` command line: one sub-command per process or tool (API.md "Command line").

Exit codes: 0 ok, 1 operation failed, 2 usage error, 3 cannot reach metadata/bookies.
Expected failures print one clear line, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import NoReturn

from zbk.errors import EXIT_OK, EXIT_USAGE, ZbkError

Command = Callable[[argparse.Namespace], int]


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def _bookie(args: argparse.Namespace) -> int:
    import signal
    import threading

    # Handlers before the heavy imports: a SIGTERM that arrives while the bookie is still
    # starting (a supervisor stopping a just-restarted child) must end in a clean stop,
    # not in the default action's kill.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    from zbk.bookie.process import run_bookie
    from zbk.config import BookieConfig, load

    explicit = {"metadata_uri": args.metadata, "data_dir": args.data_dir, "port": args.port,
                "http_port": args.http_port, "start_read_only": args.readonly}
    # Validated here, not only by the boot: a bad value (a bookie_id with '/') is a usage
    # error, exit code 2, like an unknown key, and touches nothing.
    cfg = load(BookieConfig, path=args.config, overrides=args.set, explicit=explicit).validate()
    return run_bookie(cfg, stop=stop)


def _keygen(args: argparse.Namespace) -> int:
    from zbk.wire.curve import generate_keypair

    public, secret = generate_keypair(args.dir, args.name)
    print(f"public key: {public}\nkey pair (keep private): {secret}")
    return EXIT_OK


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # usage errors exit 2 with one line (argparse does too)
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="zbk", description="zbk: a replicated, durable log store (BookKeeper design)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    b = sub.add_parser("bookie", help="run a bookie (storage server)")
    b.add_argument("--metadata", help="metadata URI: sqlite:///path/meta.db or etcd://host:port/scope")
    b.add_argument("--data-dir", help="data directory (journal/, ledgers/, index/ below it)")
    b.add_argument("--port", type=int, help="wire port (default 3181)")
    b.add_argument("--http-port", type=int, help="HTTP port for /metrics and the admin API (default 8000)")
    b.add_argument("--config", help="bookie.toml: top-level keys and a table per component ([journal], ...)")
    b.add_argument("--readonly", action="store_true", default=None,
                   help="start read-only; it lasts (across restarts too) until PUT /api/v1/bookie/state "
                        '{"state": "writable"}')
    b.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config key, as table.key or by its flat name (repeatable)")
    b.set_defaults(func=_bookie)

    k = sub.add_parser("keygen", help="write a CURVE key pair (NAME.key public, NAME.key_secret private)")
    k.add_argument("--dir", required=True, help="directory for the key files")
    k.add_argument("--name", required=True, help="file name stem, e.g. the bookie or client name")
    k.set_defaults(func=_keygen)

    from zbk.cli import bench, sandbox, shell

    shell.add_parser(sub)
    bench.add_parser(sub)
    from zbk.recovery import process as autorecovery

    autorecovery.add_parser(sub)
    sandbox.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose)
    try:
        code = args.func(args)
    except ZbkError as e:
        print(f"zbk: {e.code}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
