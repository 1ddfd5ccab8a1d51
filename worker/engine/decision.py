"""The decision log: the single commit point of every cycle, and the epoch of every partition.

Per (connector, topic-partition) one entry ``{owner, epoch, next_offset, txn}``:

* ``acquire`` bumps the epoch (compare-and-set on the entry's version) and makes this worker
  the owner: from then on every older owner is a zombie for that partition.
* ``decide`` writes ``{epoch, next_offset, txn}`` for every partition of a transaction in one
  atomic compare-and-set on all of them: it succeeds only if this worker still holds each one at
  the version it last wrote. That write *is* the commit; the sinks' commits only follow it.
* ``read`` lets recovery tie a prepared transaction back to the decision (txn named -> commit),
  and :func:`settle_unknown` find out whether a decision whose reply was lost landed.

An entry is stored as JSON (:meth:`Entry.to_bytes` / :meth:`Entry.from_bytes`): the admin API
reads and rewrites the same entries, with the same codec.

:class:`ZooKeeperDecisionLog` is the production implementation (one kazoo multi-op per
decision). :class:`MemoryDecisionLog` is for the deterministic model tests only.
"""

from __future__ import annotations

import enum
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from eosink.connectors.api import formats
from eosink.connectors.api.errors import CommitStateUnknownError, CoordinatorUnavailableError, FencedError
from eosink.connectors.api.records import TopicPartition
from eosink.worker import paths

if TYPE_CHECKING:
    from eosink.worker.engine.zk import ZkSession


@dataclass(frozen=True)
class Grant:
    """What this worker holds of one partition: its epoch, where to resume, the last decision."""

    tp: TopicPartition
    epoch: int
    next_offset: int | None
    txn: str | None
    version: int  # the entry's version after our last write: the compare-and-set token


@dataclass(frozen=True)
class Entry:
    """One partition's entry as stored: who owns it, at which epoch, and the last decision."""

    owner: str | None
    epoch: int
    next_offset: int | None
    txn: str | None

    def to_bytes(self) -> bytes:
        """The znode's data: JSON, with the time of the write (for an operator reading the tree)."""
        return json.dumps(
            {"owner": self.owner, "epoch": self.epoch, "next_offset": self.next_offset, "txn": self.txn,
             "ts": int(time.time() * 1000), "format": formats.ZOOKEEPER},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes | None, where: str = "a decision log entry") -> Entry:
        """The entry a znode holds; no data is a partition never acquired (:data:`NO_ENTRY`). An entry a newer
        eosink wrote in a format this one does not read is refused (``where``: its path, for the error)."""
        if not data:
            return NO_ENTRY
        d = json.loads(data)
        formats.check(formats.version_of(d), formats.ZOOKEEPER, "the decision log entry", where, component="decision-log")
        return cls(d.get("owner"), int(d.get("epoch", 0)), d.get("next_offset"), d.get("txn"))


#: The entry of a partition nobody has acquired yet.
NO_ENTRY = Entry(None, 0, None, None)


class PartitionsFenced(FencedError):
    def __init__(self, connector: str, partitions: Iterable[TopicPartition], detail: str = "") -> None:
        self.partitions = frozenset(partitions)
        names = ", ".join(sorted(str(tp) for tp in self.partitions))
        super().__init__(f"connector {connector}: fenced on {names}{': ' + detail if detail else ''}",
                         component="decision-log")


class DecisionLog(Protocol):
    def acquire(self, connector: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, Grant]: ...

    def decide(self, connector: str, txn_id: str, next_offsets: Mapping[TopicPartition, int],
               grants: Mapping[TopicPartition, Grant]) -> dict[TopicPartition, Grant]: ...

    def read(self, connector: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, Entry]: ...

    def release(self, connector: str, grants: Mapping[TopicPartition, Grant]) -> None: ...

    def new_generation(self, connector: str) -> int: ...


class MemoryDecisionLog:
    """In-process decision log for model tests. Same semantics as ZooKeeper's, no network."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, TopicPartition], tuple[Entry, int]] = {}
        self._lock = threading.Lock()
        self._generation = 0

    def acquire(self, connector: str, partitions: Iterable[TopicPartition],
                owner: str = "memory") -> dict[TopicPartition, Grant]:
        out: dict[TopicPartition, Grant] = {}
        with self._lock:
            for tp in partitions:
                entry, version = self._entries.get((connector, tp), (NO_ENTRY, -1))
                new = Entry(owner, entry.epoch + 1, entry.next_offset, entry.txn)
                self._entries[(connector, tp)] = (new, version + 1)
                out[tp] = Grant(tp, new.epoch, new.next_offset, new.txn, version + 1)
        return out

    def decide(self, connector: str, txn_id: str, next_offsets: Mapping[TopicPartition, int],
               grants: Mapping[TopicPartition, Grant]) -> dict[TopicPartition, Grant]:
        with self._lock:
            stale = [tp for tp in next_offsets
                     if self._entries.get((connector, tp), (NO_ENTRY, -2))[1] != grants[tp].version]
            if stale:
                raise PartitionsFenced(connector, stale)
            out: dict[TopicPartition, Grant] = {}
            for tp, off in next_offsets.items():
                entry, version = self._entries[(connector, tp)]
                self._entries[(connector, tp)] = (Entry(entry.owner, entry.epoch, off, txn_id), version + 1)
                out[tp] = replace(grants[tp], next_offset=off, txn=txn_id, version=version + 1)
            return out

    def read(self, connector: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, Entry]:
        with self._lock:
            return {tp: self._entries.get((connector, tp), (NO_ENTRY, -1))[0] for tp in partitions}

    def release(self, connector: str, grants: Mapping[TopicPartition, Grant]) -> None:
        pass

    def new_generation(self, connector: str) -> int:
        with self._lock:
            self._generation += 1
            return self._generation


class ZooKeeperDecisionLog:
    """The fenced decision log in ZooKeeper (``/eosink/<cluster>/partitions/<connector>/<tp>``).

    ``decide`` is one kazoo transaction of ``set_data(path, data, version)`` per partition: all
    applied or none. kazoo's ``commit()`` does not raise on a failed compare-and-set; it returns
    per-operation results, so every result is tested.
    """

    def __init__(self, session: ZkSession, worker_id: str) -> None:
        self.session = session
        self.zk = session.client
        self.root = session.root
        self.worker_id = worker_id

    def _path(self, connector: str, tp: TopicPartition) -> str:
        return paths.partition(self.root, connector, tp)

    def acquire(self, connector: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, Grant]:
        from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

        self.session.require_connected()
        out: dict[TopicPartition, Grant] = {}
        for tp in partitions:
            path = self._path(connector, tp)
            while True:
                try:
                    data, stat = self.zk.get(path)
                except NoNodeError:
                    try:
                        self.zk.create(path, Entry(self.worker_id, 1, None, None).to_bytes(), makepath=True)
                        out[tp] = Grant(tp, 1, None, None, 0)
                        break
                    except NodeExistsError:
                        continue
                entry = Entry.from_bytes(data, f"ZooKeeper {path}")
                try:
                    bumped = Entry(self.worker_id, entry.epoch + 1, entry.next_offset, entry.txn)
                    stat = self.zk.set(path, bumped.to_bytes(), version=stat.version)
                except BadVersionError:
                    continue  # someone else moved it between our read and write: read again
                out[tp] = Grant(tp, entry.epoch + 1, entry.next_offset, entry.txn, stat.version)
                break
        return out

    def decide(self, connector: str, txn_id: str, next_offsets: Mapping[TopicPartition, int],
               grants: Mapping[TopicPartition, Grant]) -> dict[TopicPartition, Grant]:
        from kazoo.exceptions import ConnectionLoss, OperationTimeoutError, SessionExpiredError

        if not self.session.can_decide():
            raise CoordinatorUnavailableError("ZooKeeper connection is suspended; decision not sent", component="decision-log")
        tx = self.zk.transaction()
        order = list(next_offsets)
        for tp in order:
            g = grants[tp]
            decision = Entry(self.worker_id, g.epoch, next_offsets[tp], txn_id)
            tx.set_data(self._path(connector, tp), decision.to_bytes(), version=g.version)
        try:
            results = tx.commit_async().get(timeout=self.session.request_timeout)
        except (ConnectionLoss, OperationTimeoutError, SessionExpiredError, self.session.timeout_exception) as exc:
            raise CommitStateUnknownError(f"decision of {txn_id} sent, outcome unknown: {exc!r}",
                                          component="decision-log") from exc
        failed = [tp for tp, r in zip(order, results)
                  if isinstance(r, Exception) and type(r).__name__ != "RuntimeInconsistency"]
        if failed or any(isinstance(r, Exception) for r in results):
            raise PartitionsFenced(connector, failed or order, f"decision of {txn_id} refused")
        return {tp: replace(grants[tp], next_offset=next_offsets[tp], txn=txn_id, version=r.version)
                for tp, r in zip(order, results)}

    def read(self, connector: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, Entry]:
        from kazoo.exceptions import NoNodeError

        # Never a plain get(): while the connection is suspended kazoo holds a request until it is back,
        # so a worker cut off from ZooKeeper would wait here for the whole cut (seen: a minute).
        if not self.session.can_decide():
            raise CoordinatorUnavailableError("ZooKeeper connection is suspended; decision log not read", component="decision-log")
        out: dict[TopicPartition, Entry] = {}
        for tp in partitions:
            try:
                path = self._path(connector, tp)
                data, _ = self.zk.get_async(path).get(timeout=self.session.request_timeout)
                out[tp] = Entry.from_bytes(data, f"ZooKeeper {path}")
            except NoNodeError:
                out[tp] = NO_ENTRY
        return out

    def release(self, connector: str, grants: Mapping[TopicPartition, Grant]) -> None:
        """Graceful handoff: clear the owner (same epoch) so the next owner need not wait."""
        from kazoo.exceptions import KazooException

        if not self.session.can_decide():
            return  # cut off: nothing to hand over (and a request would wait for the connection)
        for tp, g in grants.items():
            try:
                released = Entry(None, g.epoch, g.next_offset, g.txn)
                self.zk.set_async(self._path(connector, tp), released.to_bytes(), version=g.version).get(
                    timeout=self.session.request_timeout)
            except (KazooException, self.session.timeout_exception):
                pass  # someone already took it over, or we are cut off: nothing to hand over

    def new_generation(self, connector: str) -> int:
        """A number unique per connector and increasing: ZooKeeper's sequential-node counter."""
        path = self.zk.create(f"{paths.generations(self.root, connector)}/g-", b"",
                              ephemeral=True, sequence=True, makepath=True)
        return int(path.rsplit("-", 1)[1])


class Settlement(enum.Enum):
    """What a decision sent with an unknown outcome turned out to be."""

    DECIDED = "decided"  # our write landed: the txn is committed, the sinks must follow
    NOT_DECIDED = "not decided"  # it did not: nothing is committed, the cycle aborts
    CANNOT_TELL = "cannot tell"  # the log stayed unreadable: recovery (ours or the next owner's) settles it


@dataclass(frozen=True)
class Settled:
    outcome: Settlement
    #: DECIDED: the grants after our write.
    grants: dict[TopicPartition, Grant] = field(default_factory=dict)
    #: NOT_DECIDED: the partitions a newer epoch has taken meanwhile (we are fenced on them).
    overtaken: frozenset[TopicPartition] = frozenset()


def settle_unknown(
    log: DecisionLog,
    connector: str,
    txn_id: str,
    next_offsets: Mapping[TopicPartition, int],
    grants: Mapping[TopicPartition, Grant],
    *,
    wait_s: float,
    sleep: Callable[[float], None] = time.sleep,
) -> Settled:
    """Read the log once reconnected (for at most ``wait_s``) to learn whether decision ``txn_id`` landed.

    A decision writes every partition at once, so either all entries name ``txn_id`` or none
    does. When they do, the new grants follow from the old ones: a ``set_data`` bumps an entry's
    version by exactly one, and the entries naming our txn prove our write is the one that landed.
    """
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            entries = log.read(connector, next_offsets)
        except Exception:  # noqa: BLE001 - not reconnected yet
            sleep(0.2)
            continue
        if all(e.txn == txn_id for e in entries.values()):
            decided = {tp: Grant(tp, grants[tp].epoch, off, txn_id, grants[tp].version + 1)
                       for tp, off in next_offsets.items()}
            return Settled(Settlement.DECIDED, grants=decided)
        return Settled(Settlement.NOT_DECIDED, overtaken=_overtaken(log, connector, next_offsets, grants))
    return Settled(Settlement.CANNOT_TELL)


def _overtaken(log: DecisionLog, connector: str, partitions: Iterable[TopicPartition],
               grants: Mapping[TopicPartition, Grant]) -> frozenset[TopicPartition]:
    """The partitions of ``grants`` that a newer epoch holds now."""
    try:
        entries = log.read(connector, partitions)
    except Exception:  # noqa: BLE001 - cannot tell: not fenced as far as we know
        return frozenset()
    return frozenset(tp for tp, e in entries.items() if e.epoch > grants[tp].epoch)
