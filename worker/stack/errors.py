"""Errors of the local stack, worded for the person at the terminal (the CLI prints ``str(e)``)."""

from __future__ import annotations

from pathlib import Path


class StackError(Exception):
    """Anything that stops the stack from coming up or down; the message says what to do."""


class StackNotRunning(StackError):
    """The endpoints file is missing: nobody has run ``eosink stack up`` for this home."""


class ComponentError(StackError):
    """One component failed; the message names it, says what happened and quotes its log.

    The log tail is part of the message because the first thing anyone does with such an
    error is open the log, and in CI there is nobody to open it.
    """

    def __init__(self, component: str, what: str, log_path: Path | None, log_tail: str = "") -> None:
        self.component = component
        self.what = what
        self.log_path = log_path
        self.log_tail = log_tail
        message = f"{component}: {what}"
        if log_path is not None:
            message += f" (log: {log_path})"
        if log_tail.strip():
            indented = "\n".join("    " + line for line in log_tail.rstrip().splitlines())
            message += f"\n  last lines of {log_path.name if log_path else 'its output'}:\n{indented}"
        super().__init__(message)
