"""Optional ZeroMQ CURVE on the wire protocol: encryption and client authentication.

Keys are ZeroMQ certificate files (``zmq.auth``; Z85 text): ``NAME.key`` holds a public
key, ``NAME.key_secret`` the pair. ``zbk keygen --dir DIR --name NAME`` writes both.

Bookie (``BookieConfig``, its ``[curve]`` table)
    ``secret_key_file`` (flat: ``curve_secret_key_file``): the bookie's own pair.
    ``authorized_keys_dir`` (``curve_authorized_keys_dir``): a
    directory of client public keys (``*.key``); only those clients complete the
    handshake. The check is a ZAP handler (``zmq.auth`` ThreadAuthenticator) on the
    bookie's context, consulted for every new connection; the directory is re-read when
    its modification time changes, so adding or removing a key file takes effect for new
    connections without a restart. Established connections are not cut.

Client (``ClientConfig``)
    ``curve_secret_key_file``: the client's own pair. The bookies' public key, from
    ``curve_server_public_key_file`` (one key for every bookie), or per bookie from
    ``curve_server_keys_dir``: a file named after the bookie's id, whatever form it takes,
    with ``:`` written ``_`` (``<host>_<port>.key``, or ``bookie-a.key`` for a bookie with a
    name id), that directory's ``server.key`` serving the bookies without a file of their
    own. The file goes with the id, not the address: a bookie that moves keeps its key.

What an unauthorized peer sees: a client without CURVE, with an unknown key, or with the
wrong server key never completes the handshake, so no request reaches the bookie and no
answer comes back. The client transport reports a refused key as UnauthorizedError (it
watches the handshake events of its sockets) and anything else as BookieUnavailableError.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from zbk import limits
from zbk.errors import ConfigError

if TYPE_CHECKING:
    from zbk.config import ClientConfig, CurveConfig

log = logging.getLogger(__name__)

ZAP_DOMAIN = "zbk"
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
DEFAULT_SERVER_KEY = "server.key"


def server_key_file_name(bookie_id: str) -> str:
    """The name of the public key file of the bookie ``bookie_id`` in a client's
    ``curve_server_keys_dir``: the id with ``:`` as ``_`` (a file name with a colon is
    awkward on some systems and in shell completions). A bookie's configuration never has
    ``/`` in its id (zbk/bookieid.py); an id read from damaged metadata might, and must not
    lead out of the directory."""
    if not bookie_id or "/" in bookie_id or os.sep in bookie_id:
        raise ConfigError(f"CURVE client: bookie id {bookie_id!r} cannot name a key file")
    return bookie_id.replace(":", "_") + PUBLIC_SUFFIX


def generate_keypair(directory: str, name: str) -> tuple[str, str]:
    """Write ``NAME.key`` (public) and ``NAME.key_secret`` (the pair, mode 0600) into
    ``directory``; returns both paths. Refuses to overwrite an existing pair."""
    if not name or os.sep in name or name.startswith("."):
        raise ConfigError(f"key name {name!r} must be a plain file name")
    os.makedirs(directory, exist_ok=True)
    public, secret = (os.path.join(directory, name + s) for s in (PUBLIC_SUFFIX, SECRET_SUFFIX))
    for path in (public, secret):
        if os.path.exists(path):
            raise ConfigError(f"{path} exists already: not overwriting a key")
    public, secret = zmq.auth.create_certificates(directory, name)
    os.chmod(secret, 0o600)
    return public, secret


def load_keypair(secret_key_file: str) -> tuple[bytes, bytes]:
    """(public, secret) Z85 keys from a ``.key_secret`` file; ConfigError if unusable."""
    public, secret = _load(secret_key_file)
    if secret is None:
        raise ConfigError(f"{secret_key_file}: holds no secret key (use the .key_secret file)")
    return public, secret


def load_public_key(path: str) -> bytes:
    return _load(path)[0]


def _load(path: str) -> tuple[bytes, bytes | None]:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:  # missing file, or no "public-key" in it
        raise ConfigError(f"CURVE key file {path}: {e}") from None
    if len(public) != 40 or (secret is not None and len(secret) != 40):
        raise ConfigError(f"CURVE key file {path}: keys must be 40 Z85 characters")
    return public, secret


def _public_keys_in(directory: str) -> set[bytes]:
    keys: set[bytes] = set()
    for path in sorted(Path(directory).glob("*" + PUBLIC_SUFFIX)):
        try:
            keys.add(load_public_key(str(path)))
        except ConfigError as e:
            log.error("CURVE: ignoring authorized key file: %s", e)
    return keys


class CurveServer:
    """A bookie's CURVE setup: its key pair and the set of authorized client keys.

    ``apply(socket)`` makes a socket a CURVE server and starts the ZAP handler on the
    socket's context (once); ``close()`` stops it. Used by the Server loop.
    """

    def __init__(self, secret_key_file: str, authorized_keys_dir: str) -> None:
        self.public_key, self.secret_key = load_keypair(secret_key_file)
        if not os.path.isdir(authorized_keys_dir):
            raise ConfigError(f"curve_authorized_keys_dir {authorized_keys_dir}: not a directory")
        self.authorized_keys_dir = authorized_keys_dir
        self._lock = threading.Lock()
        self._mtime_ns = -1
        self._allowed: set[bytes] = set()
        self._denied_logged: dict[bytes, float] = {}
        self._auth: ThreadAuthenticator | None = None
        self.denied = 0  # handshakes refused (tests, logs)
        self.reload()
        if not self._allowed:
            log.warning("CURVE: no client key in %s yet: every client is refused", authorized_keys_dir)

    @classmethod
    def from_config(cls, cfg: CurveConfig) -> CurveServer | None:
        """The bookie's ``[curve]`` section; None when CURVE is off."""
        if not cfg.secret_key_file:
            return None
        return cls(cfg.secret_key_file, cfg.authorized_keys_dir)

    def reload(self) -> bool:
        """Re-read the authorized keys if the directory changed; True when it was re-read."""
        try:
            mtime = os.stat(self.authorized_keys_dir).st_mtime_ns
        except OSError as e:
            log.error("CURVE: cannot read %s (keeping %d keys): %s", self.authorized_keys_dir, len(self._allowed), e)
            return False
        with self._lock:
            if mtime == self._mtime_ns:
                return False
            self._allowed = _public_keys_in(self.authorized_keys_dir)
            self._mtime_ns = mtime
        log.info("CURVE: %d authorized client key(s) in %s", len(self._allowed), self.authorized_keys_dir)
        return True

    def callback(self, domain: str, client_key: bytes) -> bool:
        """ZAP credentials provider (runs on the authenticator thread): is the key allowed?"""
        self.reload()
        with self._lock:
            allowed = client_key in self._allowed
        if not allowed:
            self.denied += 1
            now = time.monotonic()
            if now - self._denied_logged.get(client_key, -limits.curve_denial_log_interval_s) \
                    >= limits.curve_denial_log_interval_s:
                self._denied_logged[client_key] = now
                log.warning("CURVE: refused a client with unknown public key %s", client_key.decode(errors="replace"))
        return allowed

    def apply(self, sock: zmq.Socket[Any]) -> None:
        if self._auth is None:
            self._auth = ThreadAuthenticator(sock.context, log=log.getChild("zap"))
            self._auth.start()
            self._auth.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=self)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public_key)
        sock.setsockopt(zmq.CURVE_SERVER, 1)

    def close(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None


class CurveClient:
    """A client's CURVE setup: its key pair and the bookies' public key(s)."""

    def __init__(self, secret_key_file: str, *, server_public_key_file: str = "", server_keys_dir: str = "") -> None:
        if not server_public_key_file and not server_keys_dir:
            raise ConfigError("CURVE client: set curve_server_public_key_file or curve_server_keys_dir")
        self.public_key, self.secret_key = load_keypair(secret_key_file)
        self.server_key = load_public_key(server_public_key_file) if server_public_key_file else None
        self.server_keys_dir = server_keys_dir
        if server_keys_dir and not os.path.isdir(server_keys_dir):
            raise ConfigError(f"curve_server_keys_dir {server_keys_dir}: not a directory")

    @classmethod
    def from_config(cls, cfg: ClientConfig) -> CurveClient | None:
        if not cfg.curve_secret_key_file:
            return None
        return cls(cfg.curve_secret_key_file, server_public_key_file=cfg.curve_server_public_key_file,
                   server_keys_dir=cfg.curve_server_keys_dir)

    def server_key_for(self, bookie: str) -> bytes:
        """The public key of the bookie whose id is ``bookie``."""
        if self.server_keys_dir:
            for name in (server_key_file_name(bookie), DEFAULT_SERVER_KEY):
                path = os.path.join(self.server_keys_dir, name)
                if os.path.exists(path):
                    return load_public_key(path)
        if self.server_key is None:
            raise ConfigError(f"CURVE client: no public key for bookie {bookie} in {self.server_keys_dir}")
        return self.server_key

    def apply(self, sock: zmq.Socket[Any], bookie: str) -> None:
        """Make ``sock`` a CURVE client of ``bookie`` (before it connects)."""
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_key_for(bookie))
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public_key)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret_key)
