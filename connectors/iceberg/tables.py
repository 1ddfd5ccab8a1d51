"""Catalog and table handling of the Iceberg sink (:mod:`eosink.connectors.iceberg.sink`): connect, load the
current state cheaply, auto-create and evolve tables from the records.

Schema changes are their own metadata commits, made at prepare, before any file of the txn is
written: a new optional column is invisible to readers until rows use it, so doing it outside the
txn is harmless, and an aborted txn leaves at worst an unused column.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.table import Table
from sqlalchemy import select
from sqlalchemy.orm import Session

from eosink.connectors.api.errors import FatalError, RetryableError
from eosink.connectors.api.records import SinkRecord
from eosink.connectors.api.schemas import WriterSchema
from eosink.connectors.common.schema_walk import incompatible
from eosink.connectors.iceberg import arrow as ia
from eosink.connectors.iceberg import schema_types as ist
from eosink.connectors.iceberg import txn as itx

log = logging.getLogger("eosink.connectors.iceberg.sink")


def ensure_namespace(cat: Catalog, namespace: str) -> None:
    """Create ``namespace`` unless it exists, also when another worker creates it at the same moment.

    pyiceberg's SQL catalog checks, then inserts: of two workers starting a new connector together,
    the second's insert fails on the catalog database's unique key (an IntegrityError, not
    NamespaceAlreadyExistsError) although the namespace now exists, which is all this needs.
    """
    try:
        cat.create_namespace_if_not_exists(namespace)
    except Exception:
        try:
            exists = cat.namespace_exists(namespace)
        except Exception:  # noqa: BLE001 - cannot tell: the creation's own error says more
            exists = False
        if not exists:
            raise


def _sql_metadata_location(cat: SqlCatalog, ident: str) -> str | None:
    """The current metadata file of ``ident`` in a SQL catalog: the row pyiceberg's load_table reads."""
    namespace = Catalog.namespace_to_string(Catalog.namespace_from(ident))
    with Session(cat.engine) as session:
        return session.scalar(select(IcebergTables.metadata_location).where(
            IcebergTables.catalog_name == cat.name,
            IcebergTables.table_namespace == namespace,
            IcebergTables.table_name == Catalog.table_name_from(ident),
        ))


class Tables:
    """One catalog connection and the latest state seen of each table."""

    def __init__(self, name: str, catalog_props: Mapping[str, str], *, auto_create: bool, auto_evolve: bool, kafka: bool,
                 partition_fields: Sequence[str], table_props: Mapping[str, str], attempts: int) -> None:
        self.name = name
        self.catalog_props = dict(catalog_props)
        self.auto_create, self.auto_evolve, self.kafka = auto_create, auto_evolve, kafka
        self.partition_fields = list(partition_fields)
        self.table_props = dict(table_props)
        self.attempts = attempts
        self.known: set[str] = set()  # every table this sink has touched (a commit without marker looks there)
        self._catalog: Catalog | None = None
        self._latest: dict[str, Table] = {}
        self._fields: dict[WriterSchema, ist.Fields | None] = {}  # per schema id (one object each): its columns
        self._verified: dict[str, set[WriterSchema]] = {}  # per table: the schemas compared with it
        self._last_schema: dict[str, WriterSchema] = {}  # per table: the last schema it matched, for messages

    def catalog(self) -> Catalog:
        if self._catalog is None:
            try:
                self._catalog = load_catalog(self.name, **self.catalog_props)
            except Exception as exc:  # noqa: BLE001 - classified
                raise itx.classify(exc, f"connecting to the {self.catalog_props['type']} catalog") from exc
        return self._catalog

    def close(self) -> None:
        engine = getattr(self._catalog, "engine", None)
        if engine is not None:
            engine.dispose()
        self._catalog = None
        self._latest.clear()

    def remember(self, ident: str, table: Table) -> None:
        """``table`` is the latest state of ``ident`` (e.g. as returned by our own commit)."""
        self._latest[ident] = table
        self.known.add(ident)

    def load(self, ident: str) -> Table:
        """The table as it is now in the catalog.

        A SQL catalog answers "which metadata file is current?" with one indexed SELECT; metadata
        files are immutable, so when it names the file of the table we hold, that table *is* the
        latest state (fence included) and reading + parsing the file again (it grows with every
        snapshot) is skipped. A REST catalog is always asked for the whole table.
        """
        cat = self.catalog()
        cached = self._latest.get(ident)
        if cached is not None and isinstance(cat, SqlCatalog) and _sql_metadata_location(cat, ident) == cached.metadata_location:
            return cached
        table = cat.load_table(ident)
        self.remember(ident, table)
        return table

    def ensure(self, ident: str, recs: Sequence[SinkRecord], vals: Sequence[dict[str, Any]],
               table: Table | None = None) -> tuple[Table, bool]:
        """Load ``ident`` (unless ``table`` is it, just loaded), creating or evolving it for the batch; True
        when every field has a column."""
        if table is None:
            try:
                table = self.load(ident)
            except NoSuchTableError:
                table = self._create(ident, recs, vals)
        table = self.evolve_typed(ident, recs, table)
        if not self.auto_evolve:
            return table, False
        for _ in range(self.attempts):
            new = sorted(ia.field_names(vals) - {f.name for f in table.schema().fields})
            fields = ia.infer_fields(recs, vals, new, self.kafka)
            if not fields:
                return table, True  # (what has no column yet is null in every record: a field none gives a value)
            try:
                with itx.no_retry(table).update_schema() as upd:
                    for name, ftype in fields:
                        upd.add_column(name, ftype)
                log.info("added columns %s to %s", [n for n, _ in fields], ident)
            except CommitFailedException:
                pass  # someone else changed the table: re-read and look again
            table = self.load(ident)
        raise RetryableError(f"schema of {ident} kept changing while adding columns", component=itx.COMPONENT)

    def _create(self, ident: str, recs: Sequence[SinkRecord], vals: Sequence[dict[str, Any]]) -> Table:
        if not self.auto_create:
            raise FatalError(f"table {ident} does not exist and auto.create is off", component=itx.COMPONENT) from None
        first = list(vals[0]) if vals else []
        names = first + sorted(ia.field_names(vals) - set(first))  # the records' own field order first
        typed = self.typed(recs)[:1]  # the first schema's columns; evolve_typed adds the batch's later ones
        if typed:
            fields = typed[0][1]
            self._check_names(fields, typed[0][0])
            inferred = ia.infer_fields(recs, vals, [n for n in names if n not in fields], self.kafka)  # fields no schema names
            schema = ist.table_schema([*fields.values(), *(ist.FieldType(n, t, True, True, "") for n, t in inferred)],
                                      ia.KAFKA_FIELDS if self.kafka else ())
        else:
            schema = ia.new_schema(ia.infer_fields(recs, vals, names, self.kafka), self.kafka)
        spec = ia.partition_spec(self.partition_fields, schema)
        cat = self.catalog()
        ensure_namespace(cat, ident.rsplit(".", 1)[0])
        table = cat.create_table_if_not_exists(ident, schema=schema, partition_spec=spec, properties=self.table_props)
        self.remember(ident, table)
        log.info("created Iceberg table %s at %s%s", ident, table.location(), f" from {typed[0][0].describe()}" if typed else "")
        if typed:
            self._verified[ident], self._last_schema[ident] = {typed[0][0]}, typed[0][0]
        return table

    # -- typed from the writer's schema ---------------------------------------------------------
    def typed(self, recs: Sequence[SinkRecord]) -> list[tuple[WriterSchema, ist.Fields]]:
        """The distinct writer's schemas of ``recs`` that give column types, in the order first met, with
        their columns (derived once per schema). One C pass over the batch; empty for JSON."""
        if not recs or (recs[0].value_schema is None and recs[-1].value_schema is None):
            return []
        out = []
        for schema in dict.fromkeys(map(attrgetter("value_schema"), recs)):
            if schema is None:
                continue
            if schema not in self._fields:
                self._fields[schema] = ist.fields_of(schema)
            fields = self._fields[schema]
            if fields is not None:
                out.append((schema, fields))
        return out

    def evolve_typed(self, ident: str, recs: Sequence[SinkRecord], table: Table) -> Table:
        """auto.evolve from schema versions: each schema of the batch not checked yet is compared with the
        table; new optional fields are added (nested ones inside their struct), promotions Iceberg allows made,
        columns a field may now leave null made optional - one ``update_schema()`` commit of the catalog's optimistic concurrency, before
        any file of the txn is written: of workers adding the same column, one commits, the others'
        commits conflict, re-read the table and find it there. A change the table cannot take stops the
        task (:meth:`_incompatible`) before any row of that version is written."""
        if not self.auto_evolve:
            return table
        done = self._verified.setdefault(ident, set())
        exempt = ia.KAFKA_NAMES if self.kafka else frozenset()
        for schema, fields in self.typed(recs):
            if schema in done:
                continue
            for _ in range(self.attempts + 1):
                found = ist.compare(table.schema(), fields, exempt, ident)
                if found.conflicts:
                    raise self._incompatible(ident, recs[0].topic, schema, found.conflicts)
                if not found.changes:
                    break
                self._check_names({path[0]: ftype for path, ftype in found.add if len(path) == 1}, schema)
                try:
                    with itx.no_retry(table).update_schema() as upd:
                        for path, ftype in found.add:
                            upd.add_column(path, ftype)  # optional: rows already there have no value
                        for path, ftype in found.promote:
                            upd.update_column(path, field_type=ftype)
                        for path in found.relax:
                            upd.make_column_optional(path)
                    log.info("evolved %s for %s: added %s, promoted %s, made optional %s", ident, schema.describe(),
                             [".".join(p) for p, _ in found.add], [(".".join(p), str(t)) for p, t in found.promote],
                             [".".join(p) for p in found.relax])
                except CommitFailedException:
                    pass  # another worker changed the table first: re-read it and compare again
                table = self.load(ident)
            else:
                raise RetryableError(f"schema of {ident} kept changing while evolving it for {schema.describe()}",
                                     component=itx.COMPONENT)
            done.add(schema)
            self._last_schema[ident] = schema
        return table

    def _incompatible(self, ident: str, topic: str, schema: WriterSchema, conflicts: list[tuple[str, str]]) -> FatalError:
        """The task stops: rows of this schema would fail, be cut, or leave a required column empty."""
        return FatalError(incompatible(schema, topic, self._last_schema.get(ident), f"Iceberg table {ident}", conflicts,
                                       "Alter the table (e.g. with Spark's ALTER TABLE)"), component=itx.COMPONENT)

    def _check_names(self, fields: Mapping[str, Any], schema: WriterSchema) -> None:
        """A schema field named like a Kafka coordinate column would be overwritten by it."""
        clash = sorted(set(fields) & ia.KAFKA_NAMES) if self.kafka else []
        if clash:
            raise FatalError(f"field '{clash[0]}' of {schema.describe()} collides with a Kafka coordinate column "
                             "(set fields.kafka=false to use it)", component=itx.COMPONENT)
