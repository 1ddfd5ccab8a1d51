"""The PostgreSQL sink read back: each row's Kafka coordinates, from its target tables.

A row can be tied to its outbox record only by the coordinates it carries: ``__topic``,
``__partition``, ``__offset`` (``fields.kafka``, on by default) or the three ``pk.fields`` of
``pk.mode=kafka``. Without them nothing tells a row of one record from another's, and the sink is
reported as not audited rather than guessed at.

What the rows must be depends on ``insert.mode``:

* ``insert``: one row per committed record - every due record once;
* ``upsert``: one row per key, holding the **last** committed record of that key among the due
  ones (a key whose last record is a tombstone under ``delete.enabled``: no row). A row holding an
  older record of its key is *stale*. Keys are the record's key bytes (``pk.mode=record_key``) or
  the ``pk.fields`` of its JSON value (``record_value``); a key is expected to stay in one
  partition, as Kafka's partitioner keeps it;
* ``update``, and ``insert`` with ``delete.enabled``: rows depend on what the table held before or
  on deletes by key, which the outbox alone cannot tell: not audited.

The coordinates are read with one ``COPY ... TO STDOUT`` per table (text, three columns), so a
table of millions of rows reads at the server's speed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from psycopg import sql

from eosink.connectors.api.audit import SourceView, Window
from eosink.connectors.api.errors import EosinkError, RetryableError
from eosink.connectors.api.records import TopicPartition
from eosink.connectors.postgres.config import CONNECT_KAFKA_PK

if TYPE_CHECKING:
    from eosink.connectors.postgres.sink import PostgresSink

#: Coordinate rows handed to the tally at a time.
_CHUNK = 100_000


def coordinate_columns(sink: PostgresSink) -> tuple[str, str, str] | None:
    """The columns holding topic, partition and offset, None when rows carry no coordinates."""
    s = sink.settings
    if s.pk_mode == "kafka":
        pk = tuple(s.pk_fields) or CONNECT_KAFKA_PK
        return pk[0], pk[1], pk[2]
    if s.kafka:
        return "__topic", "__partition", "__offset"
    return None


def why_not(sink: PostgresSink) -> str | None:
    s = sink.settings
    if coordinate_columns(sink) is None:
        return ("rows carry no Kafka coordinates (fields.kafka=false): nothing ties a row to its outbox record; "
                "set fields.kafka=true (new rows get __topic/__partition/__offset) to audit this sink")
    if s.insert_mode == "update":
        return "insert.mode=update changes only rows the table already held: which rows must exist cannot be told from the outbox"
    if s.insert_mode == "insert" and s.delete_enabled:
        return "insert.mode=insert with delete.enabled: tombstones delete rows by key, so a missing row cannot be told from a deleted one"
    return None


class PostgresReader:
    def __init__(self, name: str, sink: PostgresSink) -> None:
        self.name = name
        self.sink = sink
        self.limit = why_not(sink)
        s = sink.settings
        #: One row per key (upsert, not keyed by the coordinates themselves): the last record of each key.
        self.per_key = s.insert_mode == "upsert" and s.pk_mode != "kafka"
        self.needs_records = self.per_key
        self._conn: Any = None

    def _tables(self, windows: Mapping[TopicPartition, Window]) -> list[tuple[str | None, str]]:
        return sorted({self.sink._tables.key_for(tp.topic) for tp in windows}, key=lambda k: (k[0] or "", k[1]))

    def sightings(self, source: SourceView, windows: Mapping[TopicPartition, Window]) -> Iterator[tuple[TopicPartition, list[int]]]:
        cols = coordinate_columns(self.sink)
        assert cols is not None  # the engine reads only a reader without a limit
        try:
            self._conn = self._conn or self.sink._connect(autocommit=True)
            for schema, table in self._tables(windows):
                ident = sql.Identifier(*(p for p in (schema, table) if p))
                if self._conn.execute("SELECT to_regclass(%s)", (ident.as_string(self._conn),)).fetchone()[0] is None:
                    continue  # never created: every due record is missing
                mine = {tp: w for tp, w in windows.items() if self.sink._tables.key_for(tp.topic) == (schema, table)}
                yield from self._copy(ident, cols, mine)
        except EosinkError:
            raise
        except Exception as exc:  # noqa: BLE001 - psycopg's errors: the audit cannot tell
            raise RetryableError(f"reading the coordinates of {self.name}'s tables: {exc}", component="audit") from exc

    def _copy(self, ident: sql.Identifier, cols: tuple[str, str, str],
              windows: Mapping[TopicPartition, Window]) -> Iterator[tuple[TopicPartition, list[int]]]:
        """The coordinates of the rows within each window (rows before it are not under audit, rows
        past it are not due yet: a continuous audit that lags a fast connector would otherwise read
        everything delivered since its window's start, every round; with an index on the coordinates
        a narrow audit reads only its rows)."""
        t, p, o = map(sql.Identifier, cols)
        where = sql.SQL(" OR ").join(
            sql.SQL("({} = {} AND {} = {} AND {} >= {} AND {} < {})").format(
                t, sql.Literal(tp.topic), p, sql.Literal(tp.partition), o, sql.Literal(w.first), o, sql.Literal(w.end))
            for tp, w in sorted(windows.items()))
        q = sql.SQL("COPY (SELECT {}, {}, {} FROM {} WHERE {}) TO STDOUT").format(t, p, o, ident, where)
        found: dict[tuple[str, int], list[int]] = {}
        rows = 0
        tail = b""
        with self._conn.cursor().copy(q) as copy:
            for block in copy:
                data = tail + bytes(block)
                cut = data.rfind(b"\n") + 1
                tail = data[cut:]
                for line in data[:cut].split(b"\n")[:-1]:
                    topic, part, off = line.split(b"\t")
                    if part == b"\\N" or off == b"\\N":
                        continue  # a row without coordinates (written by hand): nothing to place it by
                    found.setdefault((topic.decode(), int(part)), []).append(int(off))
                    rows += 1
                if rows >= _CHUNK:
                    yield from ((TopicPartition(t, p), offs) for (t, p), offs in found.items())
                    found, rows = {}, 0
        yield from ((TopicPartition(t, p), offs) for (t, p), offs in found.items())

    def expected(self, source: SourceView, tp: TopicPartition, due: Sequence[int]) -> Sequence[int]:
        if not self.per_key:
            return due
        s = self.sink.settings
        last: dict[Any, tuple[int, bool]] = {}
        for off, key, value in source.keyed(tp):
            last[self._key(key, value)] = (off, value is None)
        return sorted(off for off, tombstone in last.values() if not (tombstone and s.delete_enabled))

    def _key(self, key: bytes | None, value: bytes | None) -> Any:
        s = self.sink.settings
        if s.pk_mode == "record_key":
            return key
        try:
            doc = json.loads(value) if value is not None else None
        except ValueError:
            return ("unparsable", value)
        return tuple(json.dumps(doc.get(f), sort_keys=True) for f in s.pk_fields) if isinstance(doc, dict) else ("none", value)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
