"""The docs runner: runs the command lines and Python examples of the docs (markdown.py says
which lines those are) in a throwaway workspace, and reports each one that fails.

The workspace is a scratch directory laid out like the repository, so that a command runs
as a reader would type it at the repository root:

* every top-level entry of the repository (``zbk/``, ``bench/``, ``tests/``, ``scripts/``,
  ``prometheus/``, ``pyproject.toml`` ...) is a symlink to the real one; what the commands
  write (``./zbk-sandbox``, key files, logs) stays in the scratch directory;
* ``.venv/bin`` holds ``python``, ``zbk`` and ``pytest``, each running the interpreter that
  runs the tests, with the repository on ``PYTHONPATH``; that directory leads ``PATH`` too,
  so a bare ``zbk`` is the same one. There is no ``pip``: nothing a doc command runs may
  install into the shared interpreter.

Each command runs with ``bash -c`` from the workspace root and must exit 0 within its
timeout. The test that uses the runner supplies a :class:`Policy`:

* ``substitutions``: placeholders of the docs (``/path/to/zbk-sandbox``) and production
  paths (``/etc/zbk``) replaced, in commands and examples alike, by places in the workspace;
* ``fixtures``: files a document's commands name as given (``bookie.toml``), written into
  the workspace before its first command;
* ``overrides``: per-command rewrites to the shortest settings (``--seconds 1``) or to free
  ports, each with its reason;
* ``exempt``: commands that do not run inside the suite, by document and exact text, each
  with its reason.

In all of these ``@ROOT@`` stands for the workspace root and each ``@FREE_PORT@`` for a
loopback port free at that moment.

Long-running commands (the sandbox, a bookie, ``zbk autorecovery``, Prometheus) are
recognised by services.py: started, checked ready (registered, answering HTTP), and
stopped by PID with the signal a reader would use; the sandbox stays up for the rest of
its document, so that the commands after it run against it (at its default addresses,
which the runner maps to its real ports). Everything the runner started
is stopped when the document is done, also when a command failed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from helpers.procs import start_process, stop_process, tail

from docs.markdown import Snippet, leading_assignments, split_comment
from docs.services import SERVICES, Service, Started
from zbk.cli.ports import free_port

ROOT_TOKEN = "@ROOT@"
PORT_TOKEN = "@FREE_PORT@"
COMMAND_TIMEOUT_S = 120.0
# Entries of the repository root that are not linked into a workspace: version control, a
# local virtualenv (the workspace has its own), and what earlier runs may have left.
_NOT_LINKED = frozenset({".git", ".venv", "zbk-sandbox", ".pytest_cache", ".mypy_cache", ".ruff_cache",
                         "__pycache__"})
_ENV_NAME = re.compile(r"^(ZBK_[A-Z0-9_]+)=")


@dataclass(frozen=True)
class Override:
    """Rewrite the commands of ``doc`` ("*": any document) that ``pattern`` matches (searched
    in the command without its comment) with ``re.sub(pattern, repl, ...)``."""

    doc: str
    pattern: str
    repl: str
    reason: str
    timeout_s: float | None = None

    def applies(self, snippet: Snippet) -> bool:
        return self.doc in ("*", snippet.doc) and re.search(self.pattern, split_comment(snippet.text)[0]) is not None


@dataclass(frozen=True)
class Policy:
    exempt: dict[tuple[str, str], str] = field(default_factory=dict)  # (doc, command) -> reason
    overrides: tuple[Override, ...] = ()
    substitutions: tuple[tuple[str, str], ...] = ()
    fixtures: dict[str, dict[str, str]] = field(default_factory=dict)  # doc -> {file name: text}
    services: tuple[Service, ...] = SERVICES
    timeout_s: float = COMMAND_TIMEOUT_S

    def unused(self, snippets: Iterable[Snippet]) -> list[str]:
        """Exemptions and overrides that no command matches any more: a doc changed and the
        entry would silently stop meaning anything."""
        items = list(snippets)
        seen = {(s.doc, s.text) for s in items}
        stale = [f"exempt {doc}: {cmd!r}" for (doc, cmd) in self.exempt if (doc, cmd) not in seen]
        stale += [f"override {o.doc}: {o.pattern!r}" for o in self.overrides
                  if not any(o.applies(s) for s in items if s.lang == "sh")]
        return stale


@dataclass
class Outcome:
    snippet: Snippet
    ok: bool
    ran: str = ""  # the command or example as run, after overrides and substitutions
    detail: str = ""  # what happened: the failure, the exemption's reason, a service's checks
    seconds: float = 0.0

    def describe(self) -> str:
        state = "ok" if self.ok else "FAILED"
        lines = [f"{self.snippet.where()} {state} ({self.seconds:.1f} s): {self.snippet.text.strip()}"]
        if self.ran and self.ran != split_comment(self.snippet.text)[0]:
            lines.append(f"  ran: {self.ran}")
        if self.detail:
            lines += ["  " + line for line in self.detail.splitlines()]
        return "\n".join(lines)


class Workspace:
    """The scratch directory commands run in (module docstring)."""

    def __init__(self, repo: Path, root: Path, python: str = sys.executable) -> None:
        self.repo, self.root, self.python = repo.resolve(), root.resolve(), python
        self.root.mkdir(parents=True, exist_ok=True)
        for entry in sorted(self.repo.iterdir()):
            target = self.root / entry.name
            if entry.name not in _NOT_LINKED and not target.exists():
                target.symlink_to(entry)
        self.bin = self.root / ".venv" / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        for name, tail_args in (("python", ""), ("python3", ""), ("zbk", " -m zbk.cli.main"), ("pytest", " -m pytest")):
            shim = self.bin / name
            shim.write_text(f'#!/bin/sh\nexec "{self.python}"{tail_args} "$@"\n')
            shim.chmod(0o755)
        self.logs = self.root / ".docrun"
        self.logs.mkdir(exist_ok=True)
        env = dict(os.environ)
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.repo), env.get("PYTHONPATH", "")) if p)
        env["PWD"] = str(self.root)
        env.pop("VIRTUAL_ENV", None)
        # A doc's command runs as a reader's would, not as a test: no pytest options inherited.
        env.pop("PYTEST_ADDOPTS", None)
        env.pop("PYTEST_CURRENT_TEST", None)
        self.env = env
        self._count = 0

    def expand(self, text: str) -> str:
        """``@ROOT@`` and ``@FREE_PORT@`` tokens replaced (module docstring)."""
        text = text.replace(ROOT_TOKEN, str(self.root))
        return re.sub(re.escape(PORT_TOKEN), lambda _m: str(free_port()), text)

    def log_path(self, snippet: Snippet, suffix: str = "log") -> Path:
        self._count += 1
        slug = re.sub(r"[^A-Za-z0-9]+", "-", snippet.doc).strip("-")
        return self.logs / f"{self._count:03d}-{slug}-L{snippet.line}.{suffix}"


def env_names_read(repo: Path, names: Iterable[str]) -> set[str]:
    """Which of the ``ZBK_*`` environment variable ``names`` some code of the repository
    reads (zbk/, bench/, tests/ except this runner's own package)."""
    wanted = set(names)
    found: set[str] = set()
    if not wanted:
        return found
    here = Path(__file__).resolve().parent
    for top in ("zbk", "bench", "tests", "scripts"):
        for path in (repo / top).rglob("*"):
            if path.suffix not in (".py", ".sh") or here in path.resolve().parents:
                continue
            text = path.read_text(errors="replace")
            found |= {n for n in wanted - found if f'"{n}"' in text or f"${n}" in text or f"${{{n}" in text}
            if found == wanted:
                return found
    return found


class DocRunner:
    """Runs the snippets of one document, in order, in one workspace."""

    def __init__(self, workspace: Workspace, policy: Policy) -> None:
        self.ws, self.policy = workspace, policy
        self.kept: list[tuple[Snippet, Started]] = []

    # -- preparing a snippet ---------------------------------------------------------------
    def substitute(self, text: str) -> str:
        for placeholder, value in self.policy.substitutions:
            text = text.replace(placeholder, value)
        # The running services' addresses, all in one pass: a port one of them maps to may
        # be a default port that another entry maps.
        live = {k: v for _, started in self.kept for k, v in started.substitutions.items()}
        if live:
            pattern = "|".join(re.escape(k) for k in sorted(live, key=len, reverse=True))
            text = re.sub(rf"(?<![\w.])(?:{pattern})(?!\d)", lambda m: live[m[0]], text)
        return self.ws.expand(text)

    def prepare(self, snippet: Snippet) -> tuple[str, float]:
        """The command line to run (comment dropped, overrides and substitutions applied) and
        its timeout."""
        code = split_comment(snippet.text)[0]
        timeout = self.policy.timeout_s
        for o in self.policy.overrides:
            if o.applies(snippet):
                code = re.sub(o.pattern, o.repl, code)
                timeout = o.timeout_s or timeout
        return self.substitute(code), timeout

    def write_fixtures(self, doc: str) -> None:
        for name, text in self.policy.fixtures.get(doc, {}).items():
            path = self.ws.root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(self.substitute(text))

    # -- running ----------------------------------------------------------------------------
    def run(self, snippets: Iterable[Snippet]) -> list[Outcome]:
        """Run every snippet in order (fixtures of each document first); stop whatever was
        kept running at the end, whatever happened."""
        outcomes: list[Outcome] = []
        fixtures_done: set[str] = set()
        try:
            for s in snippets:
                if s.doc not in fixtures_done:
                    self.write_fixtures(s.doc)
                    fixtures_done.add(s.doc)
                outcomes.append(self.run_one(s))
        finally:
            outcomes += self.stop_kept()
        return outcomes

    def run_one(self, snippet: Snippet) -> Outcome:
        t0 = time.monotonic()
        reason = self.policy.exempt.get((snippet.doc, snippet.text))
        if reason is not None:
            return Outcome(snippet, True, detail=f"exempt: {reason}")
        if snippet.lang == "python":
            out = self.run_python(snippet)
        else:
            out = self.run_command(snippet)
        out.seconds = time.monotonic() - t0
        return out

    def run_command(self, snippet: Snippet) -> Outcome:
        code, timeout = self.prepare(snippet)
        unread = self._unread_env(code)
        if unread:
            return Outcome(snippet, False, code, f"sets {', '.join(sorted(unread))}, which no code reads")
        service = next((s for s in self.policy.services if re.search(s.pattern, code)), None)
        if service is not None:
            return self.run_service(snippet, code, service)
        return self._foreground(snippet, ["bash", "-c", code], code, timeout)

    def run_python(self, snippet: Snippet) -> Outcome:
        source = self.substitute(snippet.text)
        path = self.ws.log_path(snippet, "py")
        path.write_text(source)
        return self._foreground(snippet, [self.ws.python, str(path)], source, self.policy.timeout_s)

    def _unread_env(self, code: str) -> set[str]:
        assignments, _ = leading_assignments(code)
        names = {m[1] for a in assignments if (m := _ENV_NAME.match(a))}
        return names - env_names_read(self.ws.repo, names)

    def _foreground(self, snippet: Snippet, argv: list[str], ran: str, timeout_s: float) -> Outcome:
        log = self.ws.log_path(snippet)
        proc = start_process(argv, log, env=self.ws.env, cwd=self.ws.root)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # SIGTERM first: the benches and scripts stop the processes they started on it.
            stop_process(proc, timeout_s=15.0)
            return Outcome(snippet, False, ran, f"timed out after {timeout_s:.0f} s; output:\n{tail(log)}")
        finally:
            stop_process(proc)
        if rc != 0:
            return Outcome(snippet, False, ran, f"exit code {rc}; output:\n{tail(log)}")
        return Outcome(snippet, True, ran)

    def run_service(self, snippet: Snippet, code: str, service: Service) -> Outcome:
        assignments, rest = leading_assignments(code)
        # exec: the PID we hold is the service's own, so that our signal reaches it and not
        # a shell between us.
        line = " ".join([*assignments, "exec", rest])
        log = self.ws.log_path(snippet)
        proc = start_process(["bash", "-c", line], log, env=self.ws.env, cwd=self.ws.root)
        started = Started(service, proc, log, code, self.ws.root, self.ws.env)
        try:
            checks = service.ready(started)
        except Exception as e:  # noqa: BLE001 - any failed check is this command's failure
            code_seen = started.stop()
            return Outcome(snippet, False, code, f"{service.name} not ready: {e}\n"
                                                 f"(stopped, exit code {code_seen}); output:\n{tail(log)}")
        if service.keep:
            self.kept.append((snippet, started))
            return Outcome(snippet, True, code, f"{service.name} started and ready ({checks}); "
                                                f"kept for the commands after it")
        problem = started.stop_cleanly()
        if problem:
            return Outcome(snippet, False, code, f"{service.name} ready ({checks}), but {problem}")
        return Outcome(snippet, True, code, f"{service.name} started, ready ({checks}), stopped cleanly")

    def stop_kept(self) -> list[Outcome]:
        """Stop the services kept running, last started first; each must stop cleanly."""
        outcomes: list[Outcome] = []
        while self.kept:
            snippet, started = self.kept.pop()
            t0 = time.monotonic()
            problem = started.stop_cleanly()
            detail = f"{started.service.name} stopped with {signal.Signals(started.service.stop_signal).name}"
            outcomes.append(Outcome(snippet, not problem, started.code, problem or detail + ": clean",
                                    time.monotonic() - t0))
        return outcomes


def report(outcomes: Iterable[Outcome], keep: Callable[[Outcome], bool] = lambda o: not o.ok) -> str:
    """The outcomes ``keep`` selects (the failures by default), one paragraph each."""
    return "\n".join(o.describe() for o in outcomes if keep(o))
