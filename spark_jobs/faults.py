"""Test-only fault injection for the publisher (``publish_outbox(..., fault_hook=FailAt(...))``).

Off by default: ``fault_hook`` is ``None`` unless a test passes one. A hook lives in this package,
not in a test module, so Spark's Python workers can unpickle it by reference.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from eosink.spark_jobs.task import FAULT_POINTS


class InjectedFault(RuntimeError):
    """Raised by :class:`FailAt`; a plain RuntimeError so Spark treats it as any task crash."""


class _At:
    """What every hook shares: it acts at ``point``, for ``attempts`` and ``partitions`` (``None`` =
    all), and a point that does not exist is refused when the hook is built, not silently never hit."""

    point: str
    attempts: frozenset[int]
    partitions: frozenset[int] | None

    def __post_init__(self) -> None:
        if self.point not in FAULT_POINTS:
            raise ValueError(f"unknown fault point {self.point!r}; one of {FAULT_POINTS}")

    def hits(self, point: str, partition: int, attempt: int) -> bool:
        return point == self.point and attempt in self.attempts and (self.partitions is None or partition in self.partitions)


@dataclass(frozen=True)
class FailAt(_At):
    """Raise at ``point`` for the given attempts (and partitions; ``None`` = all).

    Points: ``before_init`` (before the producer fences earlier attempts), ``after_init``,
    ``after_check``, ``after_first_batch``, ``before_commit`` (records and ledger entry flushed to
    the broker, not committed) and ``after_commit`` (committed, the task then dies so Spark retries
    it). ``crash=True`` exits the Python worker on the spot, like a killed executor: the open
    transaction is left for the next attempt's ``init_transactions``.
    """

    point: str
    attempts: frozenset[int] = frozenset({0})
    partitions: frozenset[int] | None = None
    crash: bool = False  # kill the Python worker (no abort, no cleanup) instead of raising

    def __call__(self, point: str, partition: int, attempt: int) -> None:
        if not self.hits(point, partition, attempt):
            return
        if self.crash:
            os._exit(70)
        raise InjectedFault(f"injected fault at {point} (partition {partition}, attempt {attempt})")


@dataclass(frozen=True)
class SleepAt(_At):
    """Sleep ``seconds`` at ``point`` for the given attempts/partitions (a slow task, for speculation)."""

    point: str
    seconds: float
    attempts: frozenset[int] = frozenset({0})
    partitions: frozenset[int] | None = None

    def __call__(self, point: str, partition: int, attempt: int) -> None:
        if self.hits(point, partition, attempt):
            time.sleep(self.seconds)


@dataclass(frozen=True)
class TouchAt(_At):
    """Create the file ``path`` at ``point``: tells another attempt (in another executor on this
    machine) that this one got there. Pairs with :class:`WaitAt`."""

    point: str
    path: str
    attempts: frozenset[int] = frozenset({0})
    partitions: frozenset[int] | None = None

    def __call__(self, point: str, partition: int, attempt: int) -> None:
        if self.hits(point, partition, attempt):
            with open(self.path, "a"):
                pass


@dataclass(frozen=True)
class WaitAt(_At):
    """Wait at ``point`` until the file ``path`` exists: orders two attempts of one partition
    without guessing how long the first one takes on a loaded machine."""

    point: str
    path: str
    timeout_s: float = 120.0
    attempts: frozenset[int] = frozenset({1})
    partitions: frozenset[int] | None = None

    def __call__(self, point: str, partition: int, attempt: int) -> None:
        if not self.hits(point, partition, attempt):
            return
        deadline = time.monotonic() + self.timeout_s
        while not os.path.exists(self.path):
            if time.monotonic() > deadline:
                raise InjectedFault(f"{self.path} did not appear within {self.timeout_s:.0f} s "
                                    f"(partition {partition}, attempt {attempt} waiting at {point})")
            time.sleep(0.05)


@dataclass(frozen=True)
class Hooks:
    """Several hooks in order, e.g. one slow partition and one failing partition in one job."""

    hooks: tuple

    def __call__(self, point: str, partition: int, attempt: int) -> None:
        for hook in self.hooks:
            hook(point, partition, attempt)


@dataclass(frozen=True)
class InBatches:
    """``hook`` in the given micro-batches of a streaming query only (every call, outside streaming)."""

    hook: Any
    batches: frozenset[int]

    def __call__(self, point: str, partition: int, attempt: int) -> None:
        self.hook(point, partition, attempt)


def for_batch(hook: Any, batch_id: int) -> Any:
    """The hook that applies to micro-batch ``batch_id`` (``None``: none does)."""
    if isinstance(hook, InBatches):
        return hook.hook if batch_id in hook.batches else None
    return hook


_KINDS = {cls.__name__: cls for cls in (FailAt, SleepAt, TouchAt, WaitAt, Hooks, InBatches)}


def to_option(hook: Any) -> str:
    """A hook as the string option the ``eosink`` data source takes (``fault_hook``): JSON, never pickle,
    so an option can only name the hooks of this module."""

    def enc(v: Any) -> Any:
        if type(v).__name__ in _KINDS and dataclasses.is_dataclass(v):
            return {"kind": type(v).__name__, **{f.name: enc(getattr(v, f.name)) for f in dataclasses.fields(v)}}
        if isinstance(v, frozenset):
            return {"set": sorted(v)}
        if isinstance(v, tuple):
            return [enc(x) for x in v]
        return v

    return json.dumps(enc(hook))


def from_option(text: str) -> Any:
    """The hook :func:`to_option` encoded."""

    def dec(v: Any) -> Any:
        if isinstance(v, dict) and "kind" in v:
            cls = _KINDS.get(v["kind"])
            if cls is None:
                raise ValueError(f"unknown fault hook {v['kind']!r}; one of {sorted(_KINDS)}")
            return cls(**{k: dec(x) for k, x in v.items() if k != "kind"})
        if isinstance(v, dict) and "set" in v:
            return frozenset(v["set"])
        if isinstance(v, list):
            return tuple(dec(x) for x in v)
        return v

    return dec(json.loads(text))
