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
from collections.abc import Callable
from typing import Any

import structlog

_configured = False


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
