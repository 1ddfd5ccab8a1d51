"""Where the stack keeps its files, and which ports it uses (both overridable by env vars)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from eosink.worker.stack.errors import StackError

HOST = "127.0.0.1"

# Default ports sit away from the well-known ones (2181, 9092, 5432, 5000) so a developer's own
# servers do not collide with the stack; each is overridable, e.g. EOSINK_KAFKA_PORT=29092.
DEFAULT_PORTS: dict[str, int] = {
    "EOSINK_ZOOKEEPER_PORT": 12181,
    "EOSINK_KAFKA_PORT": 19092,
    "EOSINK_KAFKA_CONTROLLER_PORT": 19093,
    "EOSINK_POSTGRES_PORT": 15432,
    "EOSINK_S3_PORT": 15000,
    "EOSINK_S3_CONSOLE_PORT": 15001,
}


def resolve_home(home: Path | None = None) -> Path:
    """The eosink home: the argument, else ``$EOSINK_HOME``, else ``<cwd>/.eosink``.

    Resolved to an absolute path because derived names (the PostgreSQL data dir) hash it.
    """
    if home is None:
        env = os.environ.get("EOSINK_HOME")
        home = Path(env) if env else Path.cwd() / ".eosink"
    return home.expanduser().resolve()


def port(env_var: str) -> int:
    """The port configured by ``env_var``, else its default; a bad value is a clear error."""
    raw = os.environ.get(env_var)
    if raw is None or raw == "":
        return DEFAULT_PORTS[env_var]
    try:
        value = int(raw)
    except ValueError:
        raise StackError(f"{env_var}={raw!r} is not a port number") from None
    if not 0 < value < 65536:
        raise StackError(f"{env_var}={value} is outside 1..65535")
    return value


@dataclass(frozen=True)
class StackLayout:
    """The file tree under ``<home>/stack``: data per component, logs, pid files."""

    home: Path

    @classmethod
    def for_home(cls, home: Path | None = None) -> StackLayout:
        return cls(resolve_home(home))

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
