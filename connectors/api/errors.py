"""Errors by outcome, under one root.

The commit cycle never inspects messages: it decides what to do from the class alone, the way
librdkafka's ``retriable()`` / ``txn_requires_abort()`` flags are read:

* :class:`RetryableError` - transient; abort the cycle, back off, retry.
* :class:`FencedError` - a newer epoch owns the partition; abort, drop it, rejoin.
* :class:`CommitStateUnknownError` - the decision may or may not have been recorded; read the
  decision log before doing anything else (never commit or abort blindly).
* :class:`FatalError` - an invariant broke, or input cannot be processed; stop and ask an operator.

Every error carries ``component`` (which part raised it) and, when there is one, ``log_file``
so the operator knows where to look.
"""

from __future__ import annotations

import enum


class Outcome(enum.Enum):
    """The three outcome classes of every sink operation (ok, retryable, fatal)."""

    OK = "ok"
    RETRYABLE = "retryable"
    FATAL = "fatal"


class EosinkError(Exception):
    """Root of every error eosink raises on purpose."""

    outcome: Outcome = Outcome.FATAL

    def __init__(self, message: str, *, component: str | None = None, log_file: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.component = component
        self.log_file = log_file

    def __str__(self) -> str:
        parts = [self.message]
        if self.component:
            parts.insert(0, f"[{self.component}]")
        if self.log_file:
            parts.append(f"(log: {self.log_file})")
        return " ".join(parts)


class RetryableError(EosinkError):
    """A transient failure: the cycle is aborted and retried after a backoff."""

    outcome = Outcome.RETRYABLE


class FencedError(RetryableError):
    """A newer epoch owns a partition of this transaction; this worker is a zombie for it."""


class CommitStateUnknownError(RetryableError):
    """The outcome of the decision write is unknown (connection lost mid-request)."""


class CoordinatorUnavailableError(RetryableError):
    """The coordination service (ZooKeeper) cannot be reached: nothing can be decided until it is.

    Not a sink's failure, so it never counts towards ``errors.retry.timeout``."""


class FatalError(EosinkError):
    """An invariant broke or the input cannot be processed: stop and ask an operator."""

    outcome = Outcome.FATAL


class ConfigError(FatalError):
    """A configuration is invalid. ``key`` names the offending configuration key."""

    def __init__(self, message: str, *, key: str | None = None, source: str | None = None) -> None:
        where = " ".join(p for p in (f"in {source}" if source else "", f"key '{key}'" if key else "") if p)
        super().__init__(f"{where}: {message}" if where else message, component="config")
        self.key = key
        self.source = source


class RecordError(FatalError):
    """A record cannot be delivered (undecodable value, wrong type for a column, missing key).

    Names the record by topic, partition and offset, and the column or field when there is one.
    """

    def __init__(
        self,
        message: str,
        *,
        topic: str,
        partition: int,
        offset: int,
        column: str | None = None,
        component: str | None = None,
    ) -> None:
        col = f", column '{column}'" if column else ""
        super().__init__(f"record {topic}[{partition}]@{offset}{col}: {message}", component=component)
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.column = column


def outcome_of(exc: BaseException) -> Outcome:
    """Classify any exception: ours by class, anything unexpected as fatal."""
    if isinstance(exc, EosinkError):
        return exc.outcome
    return Outcome.FATAL
