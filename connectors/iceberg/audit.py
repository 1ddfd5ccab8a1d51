"""The Iceberg sink read back: the ``__topic``, ``__partition``, ``__offset`` columns of each target
table's current snapshot (``fields.kafka``, on by default).

Only committed snapshots are visible: a prepared txn's files are referenced by none, so they are
not read. A table never created holds nothing (every due record is missing). Without the
coordinate columns nothing ties a row to its record: not audited.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from eosink.connectors.api.audit import UNPLACED, SourceView, Window
from eosink.connectors.api.errors import EosinkError, RetryableError
from eosink.connectors.api.records import TopicPartition

if TYPE_CHECKING:
    from eosink.connectors.iceberg.sink import IcebergSink

_COLUMNS = ("__topic", "__partition", "__offset")


class IcebergReader:
    needs_records = False

    def __init__(self, name: str, sink: IcebergSink) -> None:
        self.name = name
        self.sink = sink
        self.limit: str | None = None if sink.kafka else (
            "fields.kafka=false: rows carry no __topic/__partition/__offset, nothing ties a row to its outbox record")

    def sightings(self, source: SourceView, windows: Mapping[TopicPartition, Window]) -> Iterator[tuple[TopicPartition, list[int]]]:
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        for ident in sorted({self.sink.table_name(tp.topic) for tp in windows}):
            try:
                table = self.sink.tables.catalog().load_table(ident)
            except (NoSuchTableError, NoSuchNamespaceError):
                continue  # never created: every due record is missing
            except Exception as exc:  # noqa: BLE001 - the catalog's errors: the audit cannot tell
                raise RetryableError(f"loading Iceberg table {ident}: {exc}", component="audit") from exc
            try:
                yield from _rows(table.scan(selected_fields=_COLUMNS).to_arrow())
            except EosinkError:
                raise
            except Exception as exc:  # noqa: BLE001 - pyiceberg/pyarrow errors: the audit cannot tell
                raise RetryableError(f"scanning Iceberg table {ident}: {exc}", component="audit") from exc

    def expected(self, source: SourceView, tp: TopicPartition, due: Sequence[int]) -> Sequence[int]:
        return due

    def close(self) -> None:
        self.sink.close()


def _rows(arrow: Any) -> Iterator[tuple[TopicPartition, list[int]]]:
    found: dict[tuple[str, int], list[int]] = {}
    topics, parts, offs = (arrow.column(c).to_pylist() for c in _COLUMNS)
    for t, p, o in zip(topics, parts, offs):
        found.setdefault((t, p), []).append(UNPLACED if o is None else int(o))
    return ((TopicPartition(t, p), o) for (t, p), o in found.items())
