"""The decision log: the single commit point of every cycle, and the epoch of every partition.

Per (connector, topic-partition) one entry ``{owner, epoch, next_offset, txn}``:

* ``acquire`` bumps the epoch (compare-and-set on the entry's version) and makes this worker
  the owner: from then on every older owner is a zombie for that partition.
* ``decide`` writes ``{epoch, next_offset, txn}`` for every partition of a transaction in one
  atomic compare-and-set on all of them: it succeeds only if this worker still holds each one at
  the version it last wrote. That write *is* the commit; the sinks' commits only follow it.
* ``read`` lets recovery tie a prepared transaction back to the decision (txn named -> commit).

:class:`ZooKeeperDecisionLog` is the production implementation (one kazoo multi-op per
decision). :class:`MemoryDecisionLog` is for the deterministic model tests only.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from eosink.connectors.api.errors import CommitStateUnknownError, FencedError, RetryableError
from eosink.connectors.api.records import TopicPartition

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
    owner: str | None
    epoch: int
    next_offset: int | None
    txn: str | None


class PartitionsFenced(FencedError):
    def __init__(self, connector: str, partitions: Iterable[TopicPartition], detail: str = "") -> None:
        self.partitions = frozenset(partitions)
        names = ", ".join(sorted(str(tp) for tp in self.partitions))
        super().__init__(f"connector {connector}: fenced on {names}{': ' + detail if detail else ''}", component="decision-log")


class DecisionLog(Protocol):
    def acquire(self, connector: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, Grant]: ...

    def decide(
        self, connector: str, txn_id: str, next_offsets: Mapping[TopicPartition, int], grants: Mapping[TopicPartition, Grant]
    ) -> dict[TopicPartition, Grant]: ...

    def read(self, connector: str, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, Entry]: ...

    def release(self, connector: str, grants: Mapping[TopicPartition, Grant]) -> None: ...

    def new_generation(self, connector: str) -> int: ...


def _encode(owner: str | None, epoch: int, next_offset: int | None, txn: str | None) -> bytes:
    return json.dumps(
        {"owner": owner, "epoch": epoch, "next_offset": next_offset, "txn": txn, "ts": int(time.time() * 1000)},
        separators=(",", ":"),
    ).encode()


def _decode(data: bytes | None) -> Entry:
    if not data:
        return Entry(None, 0, None, None)
    d = json.loads(data)
    return Entry(d.get("owner"), int(d.get("epoch", 0)), d.get("next_offset"), d.get("txn"))


class MemoryDecisionLog:
    """In-process decision log for model tests. Same semantics as ZooKeeper's, no network."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, TopicPartition], tuple[Entry, int]] = {}
        self._lock = threading.Lock()
        self._generation = 0

    def acquire(self, connector: str, partitions: Iterable[TopicPartition], owner: str = "memory") -> dict[TopicPartition, Grant]:
        out = {}
        with self._lock:
            for tp in partitions:
                entry, version = self._entries.get((connector, tp), (Entry(None, 0, None, None), -1))
                new = Entry(owner, entry.epoch + 1, entry.next_offset, entry.txn)
                self._entries[(connector, tp)] = (new, version + 1)
                out[tp] = Grant(tp, new.epoch, new.next_offset, new.txn, version + 1)
        return out

    def decide(self, connector, txn_id, next_offsets, grants):
        with self._lock:
            stale = [tp for tp in next_offsets if self._entries.get((connector, tp), (None, -2))[1] != grants[tp].version]
            if stale:
                raise PartitionsFenced(connector, stale)
            out = {}
            for tp, off in next_offsets.items():
                entry, version = self._entries[(connector, tp)]
                self._entries[(connector, tp)] = (Entry(entry.owner, entry.epoch, off, txn_id), version + 1)
                out[tp] = replace(grants[tp], next_offset=off, txn=txn_id, version=version + 1)
            return out

    def read(self, connector, partitions):
        with self._lock:
            return {tp: self._entries.get((connector, tp), (Entry(None, 0, None, None), -1))[0] for tp in partitions}

    def release(self, connector, grants):
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
        return f"{self.root}/partitions/{connector}/{tp.topic}-{tp.partition}"

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
                        self.zk.create(path, _encode(self.worker_id, 1, None, None), makepath=True)
                        out[tp] = Grant(tp, 1, None, None, 0)
                        break
                    except NodeExistsError:
                        continue
                entry = _decode(data)
                try:
                    stat = self.zk.set(path, _encode(self.worker_id, entry.epoch + 1, entry.next_offset, entry.txn), version=stat.version)
                except BadVersionError:
                    continue  # someone else moved it between our read and write: read again
                out[tp] = Grant(tp, entry.epoch + 1, entry.next_offset, entry.txn, stat.version)
                break
        return out

    def decide(self, connector, txn_id, next_offsets, grants):
        from kazoo.exceptions import ConnectionLoss, OperationTimeoutError, SessionExpiredError

        if not self.session.can_decide():
            raise RetryableError("ZooKeeper connection is suspended; decision not sent", component="decision-log")
        tx = self.zk.transaction()
        order = list(next_offsets)
        for tp in order:
            g = grants[tp]
            tx.set_data(self._path(connector, tp), _encode(self.worker_id, g.epoch, next_offsets[tp], txn_id), version=g.version)
        try:
            results = tx.commit_async().get(timeout=self.session.request_timeout)
        except (ConnectionLoss, OperationTimeoutError, SessionExpiredError, self.session.timeout_exception) as exc:
            raise CommitStateUnknownError(f"decision of {txn_id} sent, outcome unknown: {exc!r}", component="decision-log") from exc
        failed = [tp for tp, r in zip(order, results) if isinstance(r, Exception) and type(r).__name__ != "RuntimeInconsistency"]
        if failed or any(isinstance(r, Exception) for r in results):
            raise PartitionsFenced(connector, failed or order, f"decision of {txn_id} refused")
        return {tp: replace(grants[tp], next_offset=next_offsets[tp], txn=txn_id, version=r.version) for tp, r in zip(order, results)}

    def read(self, connector, partitions):
        from kazoo.exceptions import NoNodeError

        out = {}
        for tp in partitions:
            try:
                data, _ = self.zk.get(self._path(connector, tp))
                out[tp] = _decode(data)
            except NoNodeError:
                out[tp] = Entry(None, 0, None, None)
        return out

    def release(self, connector, grants):
        """Graceful handoff: clear the owner (same epoch) so the next owner need not wait."""
        from kazoo.exceptions import KazooException

        for tp, g in grants.items():
            try:
                self.zk.set(self._path(connector, tp), _encode(None, g.epoch, g.next_offset, g.txn), version=g.version)
            except KazooException:
                pass  # someone already took it over, or we are cut off: nothing to hand over

    def new_generation(self, connector: str) -> int:
        """A number unique per connector and increasing: ZooKeeper's sequential-node counter."""
        path = self.zk.create(f"{self.root}/generations/{connector}/g-", b"", ephemeral=True, sequence=True, makepath=True)
        return int(path.rsplit("-", 1)[1])
