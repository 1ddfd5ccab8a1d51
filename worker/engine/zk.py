"""One kazoo session per worker, and what its connection state means for deciding.

kazoo reports SUSPENDED when the connection drops and LOST only once the server says the
session expired - which a client cut off from the server may not hear until it reconnects
(measured with kazoo). So: on SUSPENDED stop deciding at once; once a full session timeout has passed
on the local clock since the suspension, treat every partition as lost (``session_probably_lost``).
"""

from __future__ import annotations

import threading
import time

from kazoo.client import KazooClient, KazooState
from kazoo.handlers.threading import KazooTimeoutError

from eosink.connectors.api.errors import CoordinatorUnavailableError
from eosink.worker import paths
from eosink.worker.logging import get_logger

log = get_logger("eosink.worker.engine.zk")


class ZkSession:
    """A started KazooClient rooted at ``/eosink/<cluster>``, with a decide gate."""

    timeout_exception = KazooTimeoutError

    def __init__(self, hosts: str, cluster: str = "default", session_timeout: float = 10.0) -> None:
        self.root = paths.cluster_root(cluster)
        self.session_timeout = session_timeout
        self.request_timeout = max(2.0, session_timeout / 2)
        self.client = KazooClient(hosts=hosts, timeout=session_timeout)
        self._state = KazooState.LOST
        self._suspended_at: float | None = None
        self._lock = threading.Lock()
        self._stopping = False
        self.client.add_listener(self._on_state)

    def start(self, timeout: float = 30.0) -> ZkSession:
        try:
            self.client.start(timeout=timeout)
        except KazooTimeoutError as exc:
            raise CoordinatorUnavailableError(f"cannot connect to ZooKeeper at {self.client.hosts}", component="zookeeper") from exc
        self._state = KazooState.CONNECTED
        self.client.ensure_path(self.root)
        return self

    def stop(self) -> None:
        self._stopping = True  # a LOST state from our own close is not news
        try:
            self.client.stop()
            self.client.close()
        except Exception:  # noqa: BLE001 - shutting down
            pass

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's thread: keep it short, never block.
        if self._stopping:
            return
        with self._lock:
            self._state = state
            if state == KazooState.SUSPENDED:
                self._suspended_at = time.monotonic()
            elif state == KazooState.CONNECTED:
                self._suspended_at = None
        if state != KazooState.CONNECTED:
            log.warning("zookeeper_state", state=state)

    def can_decide(self) -> bool:
        return self._state == KazooState.CONNECTED and self.client.connected

    def session_probably_lost(self) -> bool:
        """True when the session is LOST, or suspended for longer than the session timeout."""
        with self._lock:
            if self._state == KazooState.LOST:
                return True
            return self._suspended_at is not None and time.monotonic() - self._suspended_at > self.session_timeout

    def require_connected(self, wait: float | None = None) -> None:
        deadline = time.monotonic() + (wait if wait is not None else self.request_timeout)
        while not self.can_decide():
            if time.monotonic() > deadline:
                raise CoordinatorUnavailableError(f"not connected to ZooKeeper ({self._state}) at {self.client.hosts}",
                                                  component="zookeeper")
            time.sleep(0.05)
