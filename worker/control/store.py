"""The connectors a cluster should run, as ZooKeeper holds them: configs, target states, restart requests.

ZooKeeper is the control plane's only store, so every worker (and the REST API of any worker, and
``eosink connectors --zookeeper``) reads and writes connectors through this one class; the layout
itself is :mod:`eosink.worker.paths`'s.
"""

from __future__ import annotations

import json
import time
from typing import Any

from eosink.worker import paths
from eosink.worker.engine.zk import ZkSession


class ConnectorStore:
    """Connector configs and target states in ZooKeeper (``/eosink/<cluster>/connectors/<name>``)."""

    def __init__(self, session: ZkSession) -> None:
        self.zk = session.client
        self._root = session.root

    def put(self, name: str, config: dict[str, Any]) -> bool:
        """Create or update; returns True when created."""
        from kazoo.exceptions import NodeExistsError

        data = json.dumps(config, sort_keys=True).encode()
        path = paths.connector_config(self._root, name)
        try:
            self.zk.create(path, data, makepath=True)
            self.zk.create(paths.target_state(self._root, name), b"RUNNING", makepath=True)
            return True
        except NodeExistsError:
            self.zk.set(path, data)
            return False

    def get(self, name: str) -> dict[str, Any] | None:
        from kazoo.exceptions import NoNodeError

        try:
            data, _ = self.zk.get(paths.connector_config(self._root, name))
        except NoNodeError:
            return None
        config: dict[str, Any] = json.loads(data)
        return config

    def names(self) -> list[str]:
        from kazoo.exceptions import NoNodeError

        try:
            return sorted(self.zk.get_children(paths.connectors(self._root)))
        except NoNodeError:
            return []

    def target_state(self, name: str) -> str:
        from kazoo.exceptions import NoNodeError

        try:
            state: str = self.zk.get(paths.target_state(self._root, name))[0].decode()
        except NoNodeError:
            return "RUNNING"
        return state or "RUNNING"

    def delete(self, name: str) -> bool:
        from kazoo.exceptions import NoNodeError

        try:
            self.zk.delete(paths.connector(self._root, name), recursive=True)
            return True
        except NoNodeError:
            return False

    def create(self, name: str, config: dict[str, Any], state: str = "RUNNING") -> bool:
        """Create atomically (config and target state in one multi-op); False when the name exists."""
        self.zk.ensure_path(paths.connectors(self._root))
        tx = self.zk.transaction()
        tx.create(paths.connector(self._root, name), b"")
        tx.create(paths.connector_config(self._root, name), json.dumps(config, sort_keys=True).encode())
        tx.create(paths.target_state(self._root, name), state.encode())
        results = tx.commit()
        return not any(isinstance(r, Exception) for r in results)

    def set_target_state(self, name: str, state: str) -> None:
        from kazoo.exceptions import NoNodeError

        path = paths.target_state(self._root, name)
        try:
            self.zk.set(path, state.encode())
        except NoNodeError:
            self.zk.create(path, state.encode(), makepath=True)

    def request_restart(self, name: str, request: dict[str, Any]) -> None:
        """Ask the workers running ``name`` to restart their tasks: ``{"workers": [...] | null, "only_failed": bool}``.

        Every request bumps the znode's version; a worker restarts when it sees a newer version than
        the one it saw when it started the task."""
        from kazoo.exceptions import NoNodeError

        data = json.dumps({**request, "requested": time.time()}, sort_keys=True).encode()
        path = paths.restart_request(self._root, name)
        try:
            self.zk.set(path, data)
        except NoNodeError:
            self.zk.create(path, data, makepath=True)

    def restart_request(self, name: str) -> tuple[int, dict[str, Any]]:
        """``(version, request)``; ``(-1, {})`` when none was ever made."""
        from kazoo.exceptions import NoNodeError

        try:
            data, stat = self.zk.get(paths.restart_request(self._root, name))
        except NoNodeError:
            return -1, {}
        return stat.version, json.loads(data)
