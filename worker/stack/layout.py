"""Where the stack keeps its files, and which ports it uses (both overridable by env vars)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from eosink.worker.stack.errors import StackError

HOST = "127.0.0.1"
SECURE_MARKER = "secure"

# Default ports sit away from the well-known ones (2181, 9092, 5432, 5000) so a developer's own
# servers do not collide with the stack; each is overridable, e.g. EOSINK_KAFKA_PORT=29092.
DEFAULT_PORTS: dict[str, int] = {
    "EOSINK_ZOOKEEPER_PORT": 12181,
    "EOSINK_KAFKA_PORT": 19092,
    "EOSINK_KAFKA_CONTROLLER_PORT": 19093,
    "EOSINK_POSTGRES_PORT": 15432,
    "EOSINK_S3_PORT": 15000,
    "EOSINK_S3_CONSOLE_PORT": 15001,
    "EOSINK_REGISTRY_PORT": 18081,
    "EOSINK_REGISTRY_MANAGEMENT_PORT": 18082,
}


def resolve_home(home: Path | None = None) -> Path:
    """The eosink home: the argument, else ``$EOSINK_HOME``, else ``<cwd>/.eosink``.

    Resolved to an absolute path because derived names (the PostgreSQL data dir) hash it.
    """
    if home is None:
        env = os.environ.get("EOSINK_HOME")
        home = Path(env) if env else Path.cwd() / ".eosink"
    return home.expanduser().resolve()


#: A secure stack (``eosink stack up --secure``) shifts every default port by this much, so it can run
#: beside an open stack on the same machine (the test suite runs both).
SECURE_PORT_OFFSET = 100


def port(env_var: str, offset: int = 0) -> int:
    """The port configured by ``env_var`` (else its default), plus ``offset``; a bad value is a clear error.

    The offset applies to a configured port too, so one set of ``EOSINK_*_PORT`` variables places
    both an open stack and a secure one (``offset`` = :data:`SECURE_PORT_OFFSET`) without collisions.
    """
    raw = os.environ.get(env_var)
    if raw is None or raw == "":
        return DEFAULT_PORTS[env_var] + offset
    try:
        value = int(raw) + offset
    except ValueError:
        raise StackError(f"{env_var}={raw!r} is not a port number") from None
    if not 0 < value < 65536:
        raise StackError(f"{env_var}={raw} (+{offset} for a secure stack) is outside 1..65535" if offset
                         else f"{env_var}={value} is outside 1..65535")
    return value


def count_from_env(env_var: str, what: str) -> int | None:
    """The whole number ``env_var`` sets (a node count: ``what`` names the unit), None when unset or empty."""
    raw = os.environ.get(env_var, "")
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise StackError(f"{env_var}={raw!r} is not a whole number of {what}") from None


def read_count(path: Path) -> int | None:
    """The node count ``up`` recorded in ``path`` (see :func:`write_count`), None when there is none."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def write_count(path: Path, count: int) -> None:
    """Record a node count, so ``down`` and ``status`` find every node without the flag."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{count}\n")


@dataclass(frozen=True)
class StackLayout:
    """The file tree under ``<home>/stack``: data per component, logs, pid files.

    ``secure``: the stack runs locked down (TLS, SASL, ACLs; see :mod:`eosink.worker.stack.secure`).
    A home is secure once ``up --secure`` wrote its marker; every later command on that home
    (``up``, ``status``, ``down``) finds the marker and acts on the secure stack, on its ports.
    """

    home: Path
    secure: bool = False

    @classmethod
    def for_home(cls, home: Path | None = None, secure: bool | None = None) -> StackLayout:
        """The layout of ``home``; ``secure=None`` reads the home's marker."""
        resolved = resolve_home(home)
        if secure is None:
            secure = (resolved / "stack" / SECURE_MARKER).exists()
        return cls(resolved, secure)

    def port(self, env_var: str) -> int:
        """The port of ``env_var`` for this stack: a secure stack's sit ``SECURE_PORT_OFFSET`` higher."""
        return port(env_var, SECURE_PORT_OFFSET if self.secure else 0)

    @property
    def secure_marker(self) -> Path:
        return self.root / SECURE_MARKER

    @property
    def secrets_dir(self) -> Path:
        """Certificates, keys and generated passwords of a secure stack (mode 0700)."""
        return self.root / "secrets"

    @property
    def root(self) -> Path:
        return self.home / "stack"

    @property
    def endpoints_file(self) -> Path:
        return self.home / "endpoints.json"

    @property
    def lock_file(self) -> Path:
        return self.root / "run" / ".lock"

    def data_dir(self, component: str) -> Path:
        return self.root / component

    def log_file(self, component: str) -> Path:
        return self.root / "logs" / f"{component}.log"

    def pid_file(self, component: str) -> Path:
        return self.root / "run" / f"{component}.pid"

    def ensure(self) -> None:
        """Create the directories every component writes into."""
        for sub in ("logs", "run"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
