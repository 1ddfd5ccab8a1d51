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


def secret_looking(name: str) -> bool:
    """Whether a setting's name says it holds a credential (``sasl.password``, ``EOSINK_ZOOKEEPER_PASSWORD``, ...)."""
    n = name.lower().replace("_", ".")
    return any(w in n for w in ("password", "secret", "token", "credential", "jaas", "basic.auth", "key.pem"))


def register_environment_secrets(environ: MutableMapping[str, str] | None = None) -> None:
    """Register the value of every ``EOSINK_*`` variable whose name says it is a credential.

    A worker may receive a secret through a variable that no code of this process reads yet (a
    component's password added to the image before the worker learns it); it is hidden all the
    same. A ``USER:PASSWORD`` pair registers its password part too."""
    for name, value in (os.environ if environ is None else environ).items():
        if name.startswith("EOSINK_") and value and secret_looking(name) and not name.endswith("_FILE"):
            register_secret(value)
            if "BASIC_AUTH" in name:
                register_secret(value.partition(":")[2])


class _RedactingFilter(logging.Filter):
    """Stdlib records (kazoo, urllib3, a library's warnings) are cut the same way as our own events."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _secrets:
            try:
                message = record.getMessage()
            except Exception:  # noqa: BLE001 - a malformed record is logged as it is
                return True
            record.msg, record.args = redact(message), None
            if record.exc_info and record.exc_info[1] is not None:
                import traceback

                record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)).rstrip())
                record.exc_info = None
        return True


_FILTER = _RedactingFilter()


def _log_uncaught(exc_type: type[BaseException], exc: BaseException, tb: Any, thread: str | None = None) -> None:
    structlog.get_logger(ROOT).error("uncaught_exception", thread=thread, exc_info=(exc_type, exc, tb))


def install_process_hooks() -> None:
    """For a long-running process (the worker), not a library caller: stdlib handlers and uncaught
    exceptions (a thread's included) go through the redactor, so a trace quoting a DSN is cut too and
    is one JSON event instead of a bare traceback on stderr."""
    for handler in (*logging.root.handlers, logging.lastResort):
        if handler is not None and _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
    if getattr(sys.excepthook, "__module__", "") != __name__:
        sys.excepthook = _log_uncaught

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        _log_uncaught(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback,
                      args.thread.name if args.thread else None)

    threading.excepthook = thread_hook


def _redact_processor(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    return redact(event) if _secrets else event


#: structlog method name -> stdlib level number, for the per-logger gate.
_METHOD_LEVEL = {"debug": 10, "info": 20, "msg": 20, "warning": 30, "warn": 30, "error": 40, "exception": 40,
                 "critical": 50, "fatal": 50}
#: Key carrying a logger's name in its event dict (bound by :func:`get_logger`, removed by the gate).
_NAME_KEY = "_logger_name"
ROOT = "eosink"  # every eosink logger is a child of this stdlib logger; its level is the configured one


def _level_gate(_logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Per-logger levels: an event passes when the stdlib logger of its name is enabled for it, so
    ``logging.getLogger(name).setLevel`` (the REST ``/admin/loggers``) governs it and its children."""
    name = event.pop(_NAME_KEY, ROOT)
    if not logging.getLogger(name).isEnabledFor(_METHOD_LEVEL.get(method, 20)):
        raise structlog.DropEvent
    return event


def _refilter() -> None:
    """structlog's cheap filter drops calls below the lowest level any eosink logger has."""
    floor = logging.getLogger(ROOT).getEffectiveLevel()
    for name, lg in list(logging.root.manager.loggerDict.items()):
        if isinstance(lg, logging.Logger) and lg.level and (name == ROOT or name.startswith(ROOT + ".")):
            floor = min(floor, lg.level)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(floor))


def set_level(name: str, level: str | int | None) -> None:
    """Set (or, with None, clear) the level of stdlib logger ``name``; eosink's structlog loggers of that name
    and below follow it at once."""
    logging.getLogger(None if name == "root" else name).setLevel(level if level is not None else logging.NOTSET)
    if _configured:
        _refilter()


def configure(level: str | None = None, *, json: bool | None = None) -> None:
    global _configured
    level_name = (level or os.environ.get("EOSINK_LOG_LEVEL", "INFO")).upper()
    if json is None:
        fmt = os.environ.get("EOSINK_LOG_FORMAT", "auto")
        json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: Any = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    logging.getLogger(ROOT).setLevel(level_name)
    structlog.configure(
        processors=[
            _level_gate,
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
    _refilter()


def get_logger(name: str) -> Any:
    if not _configured:
        configure()
    logging.getLogger(name)  # known to the stdlib tree: listed and settable through /admin/loggers
    return structlog.get_logger(name, **{_NAME_KEY: name})


def run_in_context(target: Callable[..., Any], *args: Any, name: str | None = None, daemon: bool = True) -> threading.Thread:
    """Start a thread that sees the caller's contextvars (structlog's bound context)."""
    ctx = contextvars.copy_context()
    t = threading.Thread(target=ctx.run, args=(target, *args), name=name, daemon=daemon)
    t.start()
    return t
