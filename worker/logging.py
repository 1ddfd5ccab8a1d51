"""structlog setup: JSON lines when not on a TTY (containers, CI), readable on a TTY.

Context (connector, topic, partition, epoch, txn) is bound with ``structlog.contextvars``.
Plain threads do not inherit contextvars: start task threads with :func:`run_in_context` or
bind the context inside the thread itself.
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys
import threading
from collections.abc import Callable, MutableMapping
from typing import Any

import structlog

_configured = False
_secrets: set[str] = set()
_secrets_lock = threading.Lock()
REDACTED = "[hidden]"


def register_secret(value: str) -> None:
    """Remember a secret (a resolved password-typed config value): it is cut out of every log line
    and REST response from now on, wherever it turns up (an exception message quoting a DSN...).
    Values shorter than 8 characters are not registered: they would redact ordinary words and names
    (a password "eosink" would hide every topic called eosink-*); the masking of password-typed
    keys does not depend on this."""
    if isinstance(value, str) and len(value) >= 8 and value != REDACTED:
        with _secrets_lock:
            _secrets.add(value)


def redact(obj: Any) -> Any:
    """``obj`` (str, list, dict, nested) with every registered secret replaced by ``[hidden]``."""
    if not _secrets:
        return obj
    if isinstance(obj, str):
        for s in _secrets:
            if s in obj:
                obj = obj.replace(s, REDACTED)
        return obj
    if isinstance(obj, dict):
        return {k: redact(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact(v) for v in obj]
    return obj


def _redact_processor(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    return redact(event) if _secrets else event


def configure(level: str | None = None, *, json: bool | None = None) -> None:
    global _configured
    level_name = (level or os.environ.get("EOSINK_LOG_LEVEL", "INFO")).upper()
    if json is None:
        fmt = os.environ.get("EOSINK_LOG_FORMAT", "auto")
        json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: Any = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _redact_processor,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level_name)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    _configured = True


def get_logger(name: str) -> Any:
    if not _configured:
        configure()
    return structlog.get_logger(name)


def run_in_context(target: Callable[..., Any], *args: Any, name: str | None = None, daemon: bool = True) -> threading.Thread:
    """Start a thread that sees the caller's contextvars (structlog's bound context)."""
    ctx = contextvars.copy_context()
    t = threading.Thread(target=ctx.run, args=(target, *args), name=name, daemon=daemon)
    t.start()
    return t
