"""Which table a record goes to, and making sure it can take it (:mod:`eosink.connectors.postgres.sink`).

:class:`TableCache` maps topics to tables, builds the values rows are made from (the record's
JSON object minus the fields a field filter drops, plus the Kafka key's fields with
``pk.mode=record_key`` or the Kafka coordinates with ``pk.mode=kafka``; a tombstone under
``delete.enabled`` becomes its key's fields alone), and runs auto.create /
auto.evolve before the two-phase transaction begins: from the writer's schema for records read with a
Schema Registry converter (:mod:`eosink.connectors.postgres.schema_types`), else from the JSON values.
Table metadata is cached per sink
instance; the sink asks for a re-read (:meth:`TableCache.changed`, :meth:`TableCache.clear`)
when PostgreSQL refuses something the cache said would fit.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any, TypeVar

import psycopg

from eosink.connectors.api.errors import ConfigError, FatalError, RetryableError
from eosink.connectors.api.records import SinkRecord
from eosink.connectors.api.rows import row_of
from eosink.connectors.api.schemas import WriterSchema
from eosink.connectors.common.schema_walk import incompatible
from eosink.connectors.postgres import copy as pgc
from eosink.connectors.postgres import rejects as pgr
from eosink.connectors.postgres import schema as pgs
from eosink.connectors.postgres import schema_types as pgt
from eosink.connectors.postgres.config import Settings

log = logging.getLogger("eosink.connectors.postgres.sink")
T = TypeVar("T")
TableKey = tuple[str | None, str]  # (schema or None for the search path, table)
#: Records per target table, with the values their rows are built from (same order).
Groups = dict[TableKey, tuple[list[SinkRecord], list[Any]]]
#: The sink's "run this idempotent function on the autocommit connection" (fn, what).
Runner = Callable[[Callable[[psycopg.Connection[Any]], Any], str], Any]


def display(key: TableKey) -> str:
    return ".".join(p for p in key if p)


class TableCache:
    """Table names, metadata and DDL for one sink instance."""

    def __init__(self, connector: str, config: Mapping[str, Any], settings: Settings, run: Runner) -> None:
        self.connector = connector
        self.source = f"connector '{connector}'"
        self.name_format: str = config["table.name.format"]
        self.auto_create = bool(config["auto.create"])
        self.auto_evolve = bool(config["auto.evolve"])
        self.kafka = settings.kafka
        self.upsert = settings.insert_mode == "upsert"
        self.pk_mode: str = settings.pk_mode
        self.pk_fields: list[str] = list(settings.pk_fields)
        self.deletes = settings.delete_enabled
        self.filter = settings.filter
        #: A row's values are the record's value itself (no field filter, no key or coordinate fields).
        self.plain = self.filter is None and self.pk_mode not in ("record_key", "kafka")
        self.relkinds = settings.relkinds
        self._kept: dict[str, frozenset[str]] = {}  # per topic: the field names the filter keeps or drops
        self._run = run
        self._tables: dict[TableKey, pgs.Table] = {}
        self._names: dict[str, TableKey] = {}
        #: Columns per (writer's schema, topic): one object per schema id, so derived once.
        self._typed: dict[tuple[WriterSchema, str], pgt.Columns | None] = {}
        #: The writer's schemas checked against each table (as last read) since, and the last one.
        self._verified: dict[TableKey, set[WriterSchema]] = {}
        self._last_schema: dict[TableKey, WriterSchema] = {}

    def __getitem__(self, key: TableKey) -> pgs.Table:
        return self._tables[key]

    def clear(self) -> None:
        self._tables.clear()
        self._verified.clear()

    def cached(self, key: TableKey) -> pgs.Table | None:
        """The table as last read, None if it has not been (or was cleared since)."""
        return self._tables.get(key)

    def known(self) -> list[TableKey]:
        """Every target table named so far (resolved from a topic), whether or not it exists."""
        return sorted(set(self._names.values()), key=lambda k: (k[0] or "", k[1]))

    # -- names and values -----------------------------------------------------------------------
    def key_for(self, topic: str) -> TableKey:
        """``table.name.format`` with ``${topic}`` (``.``/``-`` -> ``_``); a ``.`` separates a schema."""
        key = self._names.get(topic)
        if key is None:
            name = self.name_format.replace("${topic}", topic.replace(".", "_").replace("-", "_"))
            schema, dot, table = name.partition(".")
            key = (schema, table) if dot else (None, name)
            for part, what in ((key[0], "schema"), (key[1], "table")):
                why = pgs.check_identifier(part, what) if part is not None else None
                if why:
                    raise ConfigError(f"{why} (topic {topic!r})", key="table.name.format", source=self.source)
            self._names[topic] = key
        return key

    def group(self, records: list[SinkRecord], *, rows: bool = False) -> Groups:
        """Records per target table (one topic - the common case - costs one set() pass). ``rows``: a
        :class:`~eosink.connectors.api.rows.RowRecord` gives its row, not its value (the streamed COPY
        takes it as it is; only when the values are the records' own, no filter or key fields)."""
        if not records:
            return {}
        by_table: dict[TableKey, list[SinkRecord]] = {}
        if len(set(map(attrgetter("topic"), records))) == 1:
            by_table[self.key_for(records[0].topic)] = records
        else:
            for r in records:
                by_table.setdefault(self.key_for(r.topic), []).append(r)
        out: Groups = {}
        for key, recs in by_table.items():
            values = list(map(row_of if rows else attrgetter("value"), recs)) if self.plain else [self._value(r) for r in recs]
            out[key] = (recs, values)
        return out

    def _value(self, rec: SinkRecord) -> Any:
        """The fields a row is built from: the filtered value plus the key's fields or coordinates."""
        v = rec.value
        if v is None and self.deletes:
            return self.key_fields(rec)  # a tombstone: the key names the row to delete
        if type(v) is not dict:
            return v  # refused later, naming the record
        if self.filter is not None:
            v = self._filtered(rec.topic, v)
        if self.pk_mode == "record_key":
            return {**v, **self.key_fields(rec)}
        if self.pk_mode == "kafka":
            t, p, o = self.pk_fields
            return {**v, t: rec.topic, p: rec.partition, o: rec.offset}
        return v

    def _filtered(self, topic: str, v: dict[str, Any]) -> dict[str, Any]:
        assert self.filter is not None
        names = self._kept.get(topic)
        if names is None:
            keys = frozenset(self.pk_fields)  # key columns are never filtered out
            names = self.filter.names(topic) | keys if self.filter.include else self.filter.names(topic) - keys
            self._kept[topic] = names
        if self.filter.include:
            return {k: x for k, x in v.items() if k in names}
        return {k: x for k, x in v.items() if k not in names}

    def key_fields(self, rec: SinkRecord) -> dict[str, Any]:
        """pk.mode=record_key: the columns the Kafka key fills.

        A JSON object key gives its fields (all, or those named by pk.fields); any other key (a
        JSON scalar, or plain UTF-8 text) fills one column: pk.fields[0], else ``__key``.
        """
        key = rec.key
        if key is None:
            raise pgr.record_error(rec, "the Kafka key is null but pk.mode=record_key")
        obj: Any = key
        if isinstance(key, bytes):  # key.converter=bytes (the default): JSON if it parses, else text
            try:
                obj = json.loads(key)
            except ValueError:
                try:
                    obj = key.decode("utf-8")
                except UnicodeDecodeError:
                    raise pgr.record_error(rec, "the Kafka key is neither JSON nor UTF-8 text (pk.mode=record_key)") from None
        if type(obj) is dict:
            if not self.pk_fields:
                return obj
            for f in self.pk_fields:
                if f not in obj:
                    raise pgr.record_error(rec, f"primary key field {f!r} is missing from the Kafka key", f)
            return {f: obj[f] for f in self.pk_fields}
        if len(self.pk_fields) > 1:
            raise pgr.record_error(rec, f"the Kafka key is a JSON {type(obj).__name__}, not an object, but pk.fields names "
                                        f"{len(self.pk_fields)} fields; a non-object key fills one column")
        return {(self.pk_fields[0] if self.pk_fields else "__key"): obj}

    def pk(self, recs: Sequence[SinkRecord]) -> list[str]:
        """The primary key columns: pk.fields, or for record_key the fields of the first key."""
        if self.pk_fields or self.pk_mode != "record_key" or not recs:
            return self.pk_fields
        return list(self.key_fields(recs[0]))

    def tombstones(self, recs: Sequence[SinkRecord]) -> bool:
        """Does the batch hold records that delete (a null value with delete.enabled)?"""
        return self.deletes and any(r.value is None for r in recs)

    # -- metadata and DDL (autocommit, before the two-phase transaction) -------------------------
    def ensure(self, key: TableKey, recs: list[SinkRecord], values: list[Any]) -> None:
        """The table exists, has the Kafka columns and the first record's fields (the common case:
        the other records have the same ones; a later new field is caught while copying)."""
        if key not in self._tables:
            table = self._run(lambda c: pgs.load_table(c, key[0], key[1]), "reading the table")
            if table is None:
                table = self._create(key, recs, values)
            self._tables[key] = self._checked(table, recs)
        if recs and (recs[0].value_schema is not None or recs[-1].value_schema is not None):
            self._evolve_typed(key, recs)
        table = self._tables[key]
        first = values[0] if values else None
        if isinstance(first, dict) and any(v is not None and k not in table.columns for k, v in first.items()):
            self.evolve(key, recs, values)

    def _checked(self, table: pgs.Table, recs: Sequence[SinkRecord]) -> pgs.Table:
        """Add missing Kafka columns (auto.evolve); an upsert needs a unique index on the key."""
        if table.relkind not in self.relkinds:
            kind = {"r": "TABLE", "p": "PARTITIONED TABLE"}.get(table.relkind, table.relkind)
            raise ConfigError(f"{table.display} is a {kind}, which table.types does not list", key="table.types", source=self.source)
        missing = [c for c in pgs.KAFKA_COLUMN_NAMES if self.kafka and c not in table.columns]
        if missing:
            if not self.auto_evolve:
                raise ConfigError(f"table {table.display} lacks columns {', '.join(missing)}: add them, enable auto.evolve or "
                                  "set fields.kafka=false", key="fields.kafka", source=self.source)
            self._run(lambda c: pgs.add_columns(c, table, [kc for kc in pgs.KAFKA_COLUMNS if kc[0] in missing]), "altering the table")
            table = self._reload((table.schema, table.name))
        if self.upsert:
            pk = self.pk(recs)
            if frozenset(pk) not in table.unique_sets:
                raise ConfigError(f"table {table.display} has no PRIMARY KEY or UNIQUE index on exactly ({', '.join(pk)}); "
                                  "upsert needs one for ON CONFLICT", key="pk.fields", source=self.source)
        return table

    def changed(self, groups: Mapping[TableKey, Any]) -> bool:
        """Re-read the batch's tables; True (and the cache updated) when any differs."""
        changed = False
        for key in groups:
            cached = self._tables.get(key)
            fresh = self._reload(key)
            if cached is None or fresh.columns != cached.columns or fresh.unique_sets != cached.unique_sets:
                log.info("table %s changed since it was read: using its new definition", fresh.display)
                self._tables[key] = fresh
                self._verified.pop(key, None)
                changed = True
        return changed

    def _reload(self, key: TableKey) -> pgs.Table:
        table: pgs.Table | None = self._run(lambda c: pgs.load_table(c, key[0], key[1]), "reading the table")
        if table is None:
            raise RetryableError(f"table {display(key)} disappeared while the sink was using it", component=pgr.COMPONENT)
        return table

    def _create(self, key: TableKey, recs: list[SinkRecord], values: list[Any]) -> pgs.Table:
        if not self.auto_create:
            raise ConfigError(f"table {display(key)} does not exist and auto.create is false", key="auto.create", source=self.source)
        for r, v in zip(recs, values):
            if type(v) is not dict:
                raise pgr.non_object_error(r, v)
        pk = self.pk(recs) if self.pk_mode != "none" else []
        if pk:
            pgc.latest_per_key(recs, values, pk)  # names the first record lacking a key field
        typed = self.typed(recs)[:1]  # the first schema's columns; _evolve_typed adds the batch's later ones
        fields = {fc.name: fc.ddl for fc in typed[0][1].values()} if typed else {}
        self._check_schema_names(fields, typed)
        inferred = pgs.infer_types(values, [*fields, *(pgs.KAFKA_COLUMN_NAMES if self.kafka else ())])
        self._check_names(inferred, recs, values)
        columns = list(fields.items()) + list(inferred.items()) + (list(pgs.KAFKA_COLUMNS) if self.kafka else [])
        table = pgs.Table(key[0], key[1])
        self._run(lambda c: pgs.create_table(c, table, columns, pk), "creating the table")
        log.info("created table %s with columns %s%s", display(key), ", ".join(f"{c} {t}" for c, t in columns),
                 f" (from {typed[0][0].describe()})" if typed else "")
        if typed:
            self._verified[key], self._last_schema[key] = {typed[0][0]}, typed[0][0]
        return self._reload(key)

    def evolve(self, key: TableKey, recs: list[SinkRecord], values: list[Any]) -> None:
        """Add a column for every non-null field the table lacks (or name the record, if off): typed from the
        records' schemas first, then from the values for what no schema names (e.g. the key's fields)."""
        if recs and (recs[0].value_schema is not None or recs[-1].value_schema is not None):
            self._evolve_typed(key, recs)
        table = self._tables[key]
        new = pgs.infer_types(values, table.columns)
        if not new:
            return
        if not self.auto_evolve:
            for r, v in zip(recs, values):
                if type(v) is dict:
                    for k, x in v.items():
                        if x is not None and k in new:
                            raise pgr.record_error(r, f"{table.display} has no column {k!r} and auto.evolve is false", k)
        self._check_names(new, recs, values)
        self._run(lambda c: pgs.add_columns(c, table, list(new.items())), "altering the table")
        log.info("added columns to %s: %s", table.display, ", ".join(f"{c} {t}" for c, t in new.items()))
        self._tables[key] = self._reload(key)

    @staticmethod
    def _check_names(columns: Mapping[str, str], recs: list[SinkRecord], values: list[Any]) -> None:
        for name in columns:
            why = pgs.check_identifier(name, "field")
            if why:
                rec = next(r for r, v in zip(recs, values) if isinstance(v, dict) and name in v)
                raise pgr.record_error(rec, why, name)

    # -- typed from the writer's schema ---------------------------------------------------------
    def typed(self, recs: Sequence[SinkRecord]) -> list[tuple[WriterSchema, pgt.Columns]]:
        """The distinct writer's schemas of ``recs`` that give column types, in the order first met, with
        their columns (less the fields a field filter drops). One C pass over the batch; empty for JSON."""
        if not recs or (recs[0].value_schema is None and recs[-1].value_schema is None):
            return []
        topic = recs[0].topic
        out = []
        for schema in dict.fromkeys(map(attrgetter("value_schema"), recs)):
            if schema is None:
                continue
            cols = self._typed.get((schema, topic), {})
            if cols == {}:
                cols = self._typed[(schema, topic)] = self._kept_columns(topic, pgt.columns_of(schema))
            if cols is not None:
                out.append((schema, cols))
        return out

    def _kept_columns(self, topic: str, cols: pgt.Columns | None) -> pgt.Columns | None:
        if cols is None or self.filter is None:
            return cols
        kept = self._filtered(topic, dict.fromkeys(cols))
        return {name: fc for name, fc in cols.items() if name in kept}

    def unverified(self, key: TableKey, recs: Sequence[SinkRecord]) -> bool:
        """Whether ``recs`` hold a writer's schema not yet checked against the table (see :meth:`ensure`)."""
        done = self._verified.get(key, ())
        return self.auto_evolve and any(schema not in done for schema, _ in self.typed(recs))

    def _evolve_typed(self, key: TableKey, recs: Sequence[SinkRecord]) -> None:
        """auto.evolve from schema versions: each schema of the batch not checked yet is compared with the
        table; optional new fields get their columns (DDL in its own transaction under the advisory lock,
        ``ADD COLUMN IF NOT EXISTS``: workers adding the same column add it once); a change the table
        cannot take stops the task (:meth:`_incompatible`), before any row of it is written."""
        if not self.auto_evolve:
            return
        done = self._verified.setdefault(key, set())
        exempt = [*(pgs.KAFKA_COLUMN_NAMES if self.kafka else ()), *(self.pk(recs) if self.pk_mode in ("record_key", "kafka") else ())]
        for schema, cols in self.typed(recs):
            if schema in done:
                continue
            table = self._tables[key]
            found = pgt.compare(table, cols, exempt)
            if found.add and not found.conflicts:
                adds = [(fc.name, fc.sqltype) for fc in found.add]
                self._check_schema_names(dict(adds), [(schema, cols)])
                self._run(functools.partial(pgs.add_columns, table=table, columns=adds), "altering the table")
                log.info("added columns to %s for %s: %s", table.display, schema.describe(),
                         ", ".join(f"{c} {t}" for c, t in adds))
                table = self._tables[key] = self._reload(key)
                found = pgt.compare(table, cols, exempt)  # as the table is now, whoever added the columns
            if found.conflicts:
                raise self._incompatible(key, recs[0].topic, schema, found.conflicts)
            done.add(schema)
            self._last_schema[key] = schema

    def _incompatible(self, key: TableKey, topic: str, schema: WriterSchema, conflicts: list[tuple[str, str]]) -> FatalError:
        """The task stops: rows of this schema would fail, be cut or lose a NOT NULL column's value."""
        return FatalError(incompatible(schema, topic, self._last_schema.get(key), f"table {display(key)}", conflicts,
                                       "Alter the table by hand"), component=pgr.COMPONENT)

    def _check_schema_names(self, columns: Mapping[str, str], typed: Sequence[tuple[WriterSchema, Any]]) -> None:
        for name in columns:
            why = pgs.check_identifier(name, "field")
            if why:
                raise ConfigError(f"{why} (in {typed[0][0].describe()})", key="table.name.format", source=self.source)
