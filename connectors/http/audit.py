"""The HTTP sink read back through the endpoint's ledger: ``GET {http.url}/ledger?connector=NAME``.

An endpoint that implements the ledger (the reference server does) answers, per committed txn, the
manifest ranges it holds and how many records it holds. The records of a txn are the committed
records of its ranges, in range order, so its *i*-th record is placed at the *i*-th committed offset
of its ranges, as the S3 reader places the lines of an object: a txn held twice doubles its
offsets, a txn gone leaves them missing, a txn holding more records than its ranges have committed
ones is foreign by the surplus, fewer leaves the last ones missing.

An endpoint that answers 404 does not implement the ledger: the sink is reported NOT AUDITED with
that reason (nothing is guessed). Any other failure is the sink's read error.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import urllib3

from eosink.connectors.api.audit import UNPLACED, SourceView, Window
from eosink.connectors.api.errors import RetryableError
from eosink.connectors.api.records import TopicPartition

NO_LEDGER = ("the endpoint does not implement GET {url}/ledger (it answered 404): an HTTP endpoint is read back "
             "only through that call; audit it from the endpoint's own store")


class HttpReader:
    needs_records = False

    def __init__(self, name: str, base: str, connector: str, headers: Mapping[str, str], timeout: urllib3.Timeout,
                 shown: str) -> None:
        self.name = name
        self.url = f"{base}/ledger?connector={quote(connector, safe='')}"
        self._shown = shown  # the base URL without credentials, for messages
        self._headers = dict(headers)
        self._pool = urllib3.PoolManager(num_pools=1, maxsize=1, retries=False, timeout=timeout)
        self.limit: str | None = None
        self._first: list[dict[str, Any]] | None = None
        try:  # one call up front: an endpoint without a ledger is not audited, rather than unreadable
            self._first = self._ledger()
        except _NoLedger:
            self.limit = NO_LEDGER.format(url=shown)
        except RetryableError:
            pass  # reported as the sink's read error by sightings

    def _ledger(self) -> list[dict[str, Any]]:
        try:
            resp = self._pool.request("GET", self.url, headers=self._headers, preload_content=True)
        except urllib3.exceptions.HTTPError as exc:
            raise RetryableError(f"GET {self._shown}/ledger: {type(exc).__name__}: {exc}", component="audit") from exc
        if resp.status == 404:
            raise _NoLedger()
        if resp.status != 200:
            raise RetryableError(f"GET {self._shown}/ledger answered HTTP {resp.status}: "
                                 f"{resp.data[:500].decode('utf-8', 'replace')}", component="audit")
        try:
            ledger = json.loads(resp.data)["ledger"]
            for t in ledger:
                t["records"], t["ranges"] = int(t["records"]), [(str(r[0]), int(r[1]), int(r[2]), int(r[3])) for r in t["ranges"]]
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise RetryableError(f"GET {self._shown}/ledger answered something other than "
                                 f'{{"ledger": [{{"txn", "ranges", "records"}}]}}: {exc!r}', component="audit") from None
        return list(ledger)

    def sightings(self, source: SourceView, windows: Mapping[TopicPartition, Window]) -> Iterator[tuple[TopicPartition, list[int]]]:
        ledger, self._first = (self._first, None) if self._first is not None else (self._ledger(), None)
        for txn in ledger:
            yield from _placed(source, windows, txn["ranges"], txn["records"])

    def expected(self, source: SourceView, tp: TopicPartition, due: Sequence[int]) -> Sequence[int]:
        return due

    def close(self) -> None:
        self._pool.clear()


class _NoLedger(Exception):
    pass


def _placed(source: SourceView, windows: Mapping[TopicPartition, Window], ranges: list[tuple[str, int, int, int]],
            held: int) -> Iterator[tuple[TopicPartition, list[int]]]:
    """The offsets of one txn's ``held`` records over its ``ranges`` (in range order)."""
    placed: list[tuple[TopicPartition, list[int]]] = []
    exact, late = True, None
    for topic, partition, first, last in ranges:
        tp = TopicPartition(topic, partition)
        w = windows.get(tp)
        if w is None or first < w.first:
            exact = False  # a partition or offsets not under audit: the count cannot be checked
            if w is None or last < w.first:
                continue
        if last >= w.end:
            late = (tp, w.end)  # records past the due end: decided after the decision log was read
        offs = source.offsets(tp)
        placed.append((tp, list(offs[bisect.bisect_left(offs, first):bisect.bisect_right(offs, last)])))
    if not exact or not placed:
        yield from placed
        return
    room = held
    for tp, offs in placed:
        yield tp, offs[:max(room, 0)]
        room -= len(offs)
    if room > 0:  # more records than the ranges' committed ones
        yield (late[0], [late[1]] * room) if late is not None else (placed[0][0], [UNPLACED] * room)
