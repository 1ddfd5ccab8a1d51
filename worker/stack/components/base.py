"""What every stack component provides, so the manager can start, probe and stop it uniformly."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from eosink.worker.stack import proc
from eosink.worker.stack.errors import ComponentError
from eosink.worker.stack.layout import StackLayout


class Component(ABC):
    """One real server on 127.0.0.1, with its data dir, log file and pid file under the stack dir."""

    name: ClassVar[str]
    ready_timeout_s: ClassVar[float] = 60.0
    stop_timeout_s: ClassVar[float] = 20.0
    #: Components this one needs running first (``up`` starts it in a later wave when they are started too).
    after: ClassVar[tuple[str, ...]] = ()

    def __init__(self, layout: StackLayout) -> None:
        self.layout = layout
        # Byte offset in the log where the current start attempt begins: error messages quote
        # only this attempt's lines, not a previous run's.
        self.run_offset = 0

    @property
    def data_dir(self) -> Path:
        return self.layout.data_dir(self.name)

    @property
    def log_path(self) -> Path:
        return self.layout.log_file(self.name)

    @property
    def pid_file(self) -> Path:
        return self.layout.pid_file(self.name)

    @abstractmethod
    def ports(self) -> dict[str, int]:
        """Ports the server listens on, keyed by the env var that overrides each."""

    @abstractmethod
    def endpoint(self) -> dict[str, Any]:
        """This component's entry in endpoints.json."""

    @abstractmethod
    def address(self) -> str:
        """One-line address for humans (status table, error messages)."""

    @property
    def workdir(self) -> Path:
        """The directory the server runs in: proves a pid is this server (pid reuse guard)."""
        return self.data_dir

    def prepare(self, report: Callable[[str], None]) -> None:  # noqa: B027 - a hook: most servers need nothing
        """Fetch or build what ``launch`` needs, once per machine; long steps ``report`` progress."""

    @abstractmethod
    def launch(self) -> int:
        """Prepare data and config, start the server detached, return its pid (its group id)."""

    @abstractmethod
    def probe(self) -> None:
        """Raise unless the server answers a real request now; quick (a few seconds at most)."""

    def verify(self) -> None:  # noqa: B027 - a hook: most servers need no deeper check
        """A deeper, once-per-start check after ``probe`` passes; raises ``self.fail(...)``."""

    def terminate(self, pid: int) -> set[int]:
        """Stop the server and all its processes; return the pids that would not die."""
        return proc.kill_tree(pid, self.stop_timeout_s)

    def running_pid(self) -> int | None:
        """The pid from the pid file if that process is alive and is this server."""
        pid = proc.read_pid(self.pid_file)
        return pid if pid is not None and proc.alive(pid, self.workdir) else None

    def fail(self, what: str) -> ComponentError:
        """An error naming this component, its log, and the log's last lines from this attempt."""
        return ComponentError(self.name, what, self.log_path, proc.log_tail(self.log_path, self.run_offset))
