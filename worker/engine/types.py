"""What a task is and what it reports, apart from how it runs a cycle.

The control plane (status, settings from a connector's config) and the tests need the task's
states, outcomes and settings without the cycle's machinery; recovery and tolerance need them
without importing the task. So they live here, and ``cycle.py`` is left with the cycle itself.
"""

from __future__ import annotations

import enum
import random
import time
from dataclasses import dataclass, field

from eosink.connectors.api.records import SinkRecord, TopicPartition
from eosink.worker.engine.batch import Batch


class TaskState(str, enum.Enum):
    """The state of one connector's task on one worker (in the manner of kazoo's ``SetPartitioner``).

    .. attribute:: UNASSIGNED

        Holds no partition: nothing to consume, nothing to recover.

    .. attribute:: RECOVERING

        Holds partitions not all recovered yet: prepared txns on them are being committed,
        aborted or reported, and only the recovered ones are consumed.

    .. attribute:: RUNNING

        Every held partition is recovered: cycles run over those not blocked by an unresolved txn.

    .. attribute:: FAILED

        A fatal outcome or a bad record (without ``errors.tolerance=all``): no more cycles until an
        operator restarts the task; its partitions stay held, so nobody consumes past the failure.

    .. attribute:: STOPPED

        Stopped: its partitions were released for a prompt handoff.

    Transitions::

        UNASSIGNED --assign(partitions)--> RECOVERING --all new partitions resolved--> RUNNING
        RUNNING --cycle fenced on some partitions--> RUNNING with the rest (UNASSIGNED if none left)
        RUNNING --new partitions--> RECOVERING --> RUNNING
        RECOVERING/RUNNING --fatal outcome or bad record--> FAILED        (operator restarts it)
        any --stop()--> STOPPED                         (partitions released for a prompt handoff)
    """

    UNASSIGNED = "UNASSIGNED"
    RECOVERING = "RECOVERING"
    RUNNING = "RUNNING"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


class CycleOutcome(str, enum.Enum):
    """How one cycle ended (the failure table in ``cycle.py``)."""

    SUCCEEDED = "succeeded"
    EMPTY = "empty"
    ABORTED = "aborted"
    FENCED = "fenced"
    FATAL = "fatal"


@dataclass
class CycleResult:
    outcome: CycleOutcome
    txn_id: str | None = None
    records: int = 0
    nbytes: int = 0
    error: BaseException | None = None
    #: A sink rejected a record under errors.tolerance=all: redo the cycle at once without it.
    redo: bool = False


@dataclass
class TaskSettings:
    commit_interval_s: float = 1.0
    #: ``commit.min.interval.ms``: a cycle that has read everything available commits once it is this
    #: old instead of waiting out ``commit_interval_s`` (not sooner: at trickle traffic every cycle is
    #: caught up, and this bounds the transactions to one per this long).
    commit_min_interval_s: float = 0.25
    max_records: int = 200_000
    max_bytes: int = 64 * 1024 * 1024
    commit_retries: int = 8
    #: A decided commit failing with retryable errors is retried at least this long, too (the worker
    #: sets it from errors.retry.timeout; forever when that is -1).
    commit_retry_min_s: float = 0.0
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 10.0
    #: How long to wait for ZooKeeper to come back before leaving an unknown decision to recovery.
    unknown_decision_wait_s: float = 30.0
    #: Re-run recovery over the held partitions this often (and after every aborted cycle), so a
    #: txn a zombie prepared after our recovery, then failed to abort, is found and aborted.
    recovery_interval_s: float = 60.0
    #: ``errors.tolerance=all``: a bad record goes to the dead-letter sink and the partition moves on.
    tolerate_errors: bool = False
    #: ``errors.log.enable`` / ``errors.log.include.messages``.
    log_errors: bool = False
    log_error_messages: bool = False
    #: ``errors.retry.timeout``: a task whose cycles keep failing with retryable errors this long
    #: fails (the reason in its status); negative = retry forever.
    retry_timeout_s: float = -1.0


@dataclass
class Unresolved:
    """A prepared txn recovery could not decide: reported, and its partitions are held back."""

    txn_id: str
    partitions: frozenset[TopicPartition]
    reason: str
    #: When recovery first reported it (monotonic): its age is what an operator is alerted on.
    since: float = field(default_factory=time.monotonic)


@dataclass
class TaskStatus:
    state: TaskState
    partitions: list[str] = field(default_factory=list)
    trace: str | None = None
    unresolved: list[Unresolved] = field(default_factory=list)
    #: Records delivered per partition since this task acquired it, and the last measured lag.
    delivered: dict[str, int] = field(default_factory=dict)
    lag: dict[str, int] = field(default_factory=dict)
    paused: bool = False
    #: While cycles keep aborting on a retryable error: that error (naming its component and
    #: address) and for how long, so /status shows a fault before errors.retry.timeout fails the task.
    retrying: str | None = None
    #: Seconds each stalled partition has stood behind a transaction left open (``engine.stall``).
    stalled: dict[str, int] = field(default_factory=dict)


class Backoff:
    """Exponential backoff with full jitter, reset on success."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial, self.maximum, self.attempt = initial, maximum, 0

    def next(self) -> float:
        delay = min(self.maximum, self.initial * (2**self.attempt))
        self.attempt += 1
        return random.uniform(delay / 2, delay)

    def reset(self) -> None:
        self.attempt = 0


@dataclass
class Prepared:
    """A cycle's batch once every sink has prepared it: what the decision and the commit need."""

    batch: Batch
    records: list[SinkRecord]  # the good ones, written to the sinks
    counts: dict[TopicPartition, int]  # good records per partition
    next_offsets: dict[TopicPartition, int]  # what the decision records
