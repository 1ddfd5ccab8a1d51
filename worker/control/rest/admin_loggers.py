"""``/admin/loggers``: read and change log levels of the worker that answers, as Kafka Connect 4 does.

eosink logs through structlog, gated per logger by the stdlib logger of the same name
(:func:`eosink.worker.logging.set_level`), so a level set here is what the worker really logs at,
for that logger and every logger below it. Levels are shown with Connect's (log4j) names.

Where eosink differs from Connect, on purpose:

* ``?scope=cluster`` is refused (400): a level is set in the worker that answers; set it on each
  worker (``scope=worker``, the default) instead. An unknown scope is a 400 too (Connect falls
  back to ``worker`` silently).
* An unknown level is a 400 naming the accepted ones (Connect answers 404).
* A logger that does not exist yet is created by a ``PUT`` (Python's loggers are created on first
  use; Connect changes nothing and answers ``[]``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from eosink.worker.control.rest.messages import ApiError, Request, Response
from eosink.worker.logging import get_logger, set_level

log = get_logger("eosink.worker.control.rest")

#: Connect's (log4j) level names -> stdlib levels; Python's own names are accepted as well.
LEVELS = {"OFF": logging.CRITICAL + 10, "FATAL": logging.CRITICAL, "CRITICAL": logging.CRITICAL, "ERROR": logging.ERROR,
          "WARN": logging.WARNING, "WARNING": logging.WARNING, "INFO": logging.INFO, "DEBUG": logging.DEBUG,
          "TRACE": 5, "ALL": 1}
_NAMES = {logging.CRITICAL + 10: "OFF", logging.CRITICAL: "FATAL", logging.ERROR: "ERROR", logging.WARNING: "WARN",
          logging.INFO: "INFO", logging.DEBUG: "DEBUG", 5: "TRACE", 1: "ALL"}
_modified: dict[str, int] = {}  # logger name -> last PUT, epoch milliseconds


def level_name(level: int) -> str:
    return _NAMES.get(level) or next((n for lv, n in sorted(_NAMES.items()) if lv >= level), "OFF")


def _known() -> dict[str, logging.Logger]:
    loggers = {n: lg for n, lg in list(logging.root.manager.loggerDict.items()) if isinstance(lg, logging.Logger)}
    return {"root": logging.getLogger(), **dict(sorted(loggers.items()))}


def _describe(name: str, logger: logging.Logger) -> dict[str, Any]:
    return {"level": level_name(logger.getEffectiveLevel()), "last_modified": _modified.get(name)}


def list_loggers(api: Any, req: Request) -> Response:
    return Response(200, {n: _describe(n, lg) for n, lg in _known().items()})


def get_level(api: Any, req: Request) -> Response:
    name = req.params["logger"]
    if name == "root":
        return Response(200, _describe(name, logging.getLogger()))
    if name not in logging.root.manager.loggerDict:  # a placeholder (a parent of loggers) counts as known
        raise ApiError(404, f"Logger {name} not found.")
    return Response(200, _describe(name, logging.getLogger(name)))


def put_level(api: Any, req: Request) -> Response:
    name = req.params["logger"]
    scope = (req.query.get("scope") or ["worker"])[-1].lower()
    if scope == "cluster":
        raise ApiError(400, "scope=cluster is not supported: eosink sets a log level in the worker that answers; "
                            "send the request to each worker (scope=worker, the default)")
    if scope != "worker":
        raise ApiError(400, f"query parameter scope must be worker (the default) or cluster, got {scope!r}")
    body = req.json()
    if not isinstance(body, dict) or body.get("level") is None:
        raise ApiError(400, "Desired 'level' parameter was not specified in request.")
    raw = body["level"]
    level = LEVELS.get(raw.strip().upper()) if isinstance(raw, str) else None
    if level is None:
        raise ApiError(400, f"invalid log level {raw!r}: must be one of {', '.join(LEVELS)}")
    if not name or len(name) > 255 or any(c.isspace() for c in name):
        raise ApiError(400, f"invalid logger name {name!r}")
    changed = [n for n in _known() if name == "root" or n == name or n.startswith(name + ".")]
    if name not in changed:
        changed.insert(0, name)
    now = int(time.time() * 1000)
    for n in changed:
        set_level(n, level)
        _modified[n] = now
    log.info("log_level_set", logger=name, level=level_name(level), loggers=len(changed))
    return Response(200, sorted(changed))
