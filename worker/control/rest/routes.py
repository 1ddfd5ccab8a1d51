"""The routing table: (method, path pattern) -> handler, for :mod:`eosink.worker.control.rest.server`.

One table for every handler module (the Connect 3 API in :mod:`~eosink.worker.control.rest.api`, Connect 4's
additions in :mod:`~eosink.worker.control.rest.connect4`, ``/admin/loggers`` in
:mod:`~eosink.worker.control.rest.admin_loggers`), so the server can answer a 405 with every method of a path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eosink.worker.control.rest import admin_loggers, audit, connect4
from eosink.worker.control.rest.api import ConnectApi
from eosink.worker.control.rest.messages import Request, Response

Handler = Callable[[ConnectApi, Request], Response] | Callable[[Any, Request], Response]

#: ``{x}`` matches one path segment.
ROUTES: list[tuple[str, str, Handler]] = [
    ("GET", "/", ConnectApi.root),
    ("GET", "/health", ConnectApi.health),
    ("GET", "/ready", ConnectApi.ready),
    ("GET", "/metrics", ConnectApi.metrics),
    ("GET", "/openapi.json", ConnectApi.openapi),
    ("GET", "/connectors", ConnectApi.list_connectors),
    ("POST", "/connectors", ConnectApi.create),
    ("GET", "/connectors/{name}", ConnectApi.get),
    ("DELETE", "/connectors/{name}", ConnectApi.delete),
    ("GET", "/connectors/{name}/config", ConnectApi.get_config),
    ("PUT", "/connectors/{name}/config", ConnectApi.put_config),
    ("PATCH", "/connectors/{name}/config", connect4.patch_config),
    ("GET", "/connectors/{name}/status", ConnectApi.status),
    ("GET", "/connectors/{name}/tasks", ConnectApi.tasks),
    ("GET", "/connectors/{name}/tasks/{task}/status", ConnectApi.task_status),
    ("POST", "/connectors/{name}/tasks/{task}/restart", ConnectApi.task_restart),
    ("PUT", "/connectors/{name}/pause", ConnectApi.pause),
    ("PUT", "/connectors/{name}/resume", ConnectApi.resume),
    ("PUT", "/connectors/{name}/stop", ConnectApi.stop),
    ("POST", "/connectors/{name}/restart", ConnectApi.restart),
    ("GET", "/connectors/{name}/topics", connect4.topics),
    ("PUT", "/connectors/{name}/topics/reset", connect4.reset_topics),
    ("GET", "/connectors/{name}/offsets", ConnectApi.get_offsets),
    ("PATCH", "/connectors/{name}/offsets", ConnectApi.patch_offsets),
    ("DELETE", "/connectors/{name}/offsets", ConnectApi.delete_offsets),
    ("GET", "/connectors/{name}/transactions", ConnectApi.transactions),
    ("POST", "/connectors/{name}/audit", audit.audit),
    ("GET", "/connector-plugins", ConnectApi.list_plugins),
    ("GET", "/connector-plugins/{plugin}/config", ConnectApi.plugin_config),
    ("PUT", "/connector-plugins/{plugin}/config/validate", ConnectApi.validate),
    ("GET", "/admin/loggers", admin_loggers.list_loggers),
    ("GET", "/admin/loggers/{logger}", admin_loggers.get_level),
    ("PUT", "/admin/loggers/{logger}", admin_loggers.put_level),
]

__all__ = ["ROUTES", "Handler"]
