"""The PostgreSQL sink's bookkeeping statements (tables created in :mod:`eosink.connectors.postgres.schema`).

``eosink_txn_manifest``   what recovery needs of a prepared txn (written before it, deleted in it)
``eosink_offsets``        per (connector, topic, partition): epoch, next_offset, txn - the fence
``eosink_committed_txns`` proof of commit: visible exactly when the prepared txn committed
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg

from eosink.connectors.api.errors import FencedError
from eosink.connectors.api.records import PartitionRange, TopicPartition, TxnManifest
from eosink.connectors.postgres.rejects import COMPONENT

#: Every GID this sink prepares is ``eosink:<txn_id>``.
GID_PREFIX = "eosink:"
#: Manifests older than this whose transaction is not prepared are deleted by ``recover``
#: (a crash between the manifest insert and PREPARE leaves one; nothing needs it).
ORPHAN_MANIFEST_AGE = "15 minutes"
#: Proofs of commit older than this are deleted by ``recover`` unless a partition still names
#: them: they only answer "was this committed?" for a commit replayed after 42704.
COMMITTED_TXN_RETENTION = "7 days"


def write_manifest(conn: psycopg.Connection[Any], manifest: TxnManifest, connector: str, sink: str) -> tuple[str | None, str | None]:
    """Insert (autocommit) the manifest unless the txn is already prepared or committed.

    Returns ``(state, sink)``: state ``"prepared"``/``"committed"`` when it is (prepare is then
    a no-op, unless ``sink`` - the fingerprint stored with the prepared manifest - names another
    sink), else None. One round trip and one commit: the check and the insert are one statement.
    """
    document = manifest.to_json()[:-1] + f',"sink":{json.dumps(sink)}}}'  # from_json ignores extra keys
    row = conn.execute(
        """
        WITH st AS (
          SELECT EXISTS (SELECT 1 FROM pg_prepared_xacts WHERE gid = %(gid)s AND database = current_database()) AS prepared,
                 EXISTS (SELECT 1 FROM eosink_committed_txns WHERE txn_id = %(txn)s) AS committed
        ), ins AS (
          INSERT INTO eosink_txn_manifest (txn_id, connector, manifest, created_at)
          SELECT %(txn)s, %(connector)s, %(manifest)s::jsonb, now() FROM st WHERE NOT st.prepared AND NOT st.committed
          ON CONFLICT (txn_id) DO UPDATE SET manifest = EXCLUDED.manifest, created_at = EXCLUDED.created_at
        )
        SELECT prepared, committed, (SELECT manifest->>'sink' FROM eosink_txn_manifest WHERE txn_id = %(txn)s) FROM st
        """,
        {"gid": GID_PREFIX + manifest.txn_id, "txn": manifest.txn_id, "connector": connector, "manifest": document},
    ).fetchone()
    assert row is not None
    return ("committed" if row[1] else "prepared" if row[0] else None), row[2]


def fence(cur: psycopg.Cursor[Any], manifest: TxnManifest, connector: str) -> None:
    """Inside the two-phase transaction, first: offsets + epochs, proof of commit, manifest gone.

    One statement. The offsets upsert only overwrites a row whose epoch is not newer
    (``WHERE eosink_offsets.epoch <= EXCLUDED.epoch``); a partition missing from RETURNING means
    a newer epoch committed there: :class:`FencedError`, before anything is prepared (the rows may
    have been streamed into the transaction already; they are rolled back with it). The row lock
    it takes is held until COMMIT/ROLLBACK PREPARED, so concurrent epochs serialise on it.
    """
    ranges = merge_ranges(manifest.ranges)
    txn = manifest.txn_id
    tail = (
        " done AS (INSERT INTO eosink_committed_txns (txn_id, connector, committed_at) VALUES (%s, %s, now())),"
        " gone AS (DELETE FROM eosink_txn_manifest WHERE txn_id = %s)"
    )
    tail_params = [txn, connector, txn]
    if not ranges:
        cur.execute("WITH" + tail + " SELECT 1", tail_params)
        return
    rows = ", ".join(["(%s, %s, %s, %s, %s, %s, now())"] * len(ranges))
    params: list[Any] = [x for r in ranges for x in (connector, r.topic, r.partition, r.epoch, r.next_offset, txn)]
    cur.execute(
        "WITH fence AS (INSERT INTO eosink_offsets (connector, topic, partition, epoch, next_offset, txn_id, updated_at)"
        f" VALUES {rows} ON CONFLICT (connector, topic, partition) DO UPDATE SET epoch = EXCLUDED.epoch,"
        " next_offset = EXCLUDED.next_offset, txn_id = EXCLUDED.txn_id, updated_at = EXCLUDED.updated_at"
        " WHERE eosink_offsets.epoch <= EXCLUDED.epoch RETURNING topic, partition),"
        + tail + " SELECT topic, partition FROM fence",
        params + tail_params,
    )
    written = {(t, p) for t, p in cur.fetchall()}
    fenced = [r for r in ranges if (r.topic, r.partition) not in written]
    if fenced:
        cur.execute(
            "SELECT topic, partition, epoch FROM eosink_offsets WHERE connector = %s AND topic = ANY(%s)",
            (connector, list({r.topic for r in fenced})),
        )
        seen = {(t, p): e for t, p, e in cur.fetchall()}
        what = ", ".join(f"{r.topic}-{r.partition} (epoch {r.epoch} < {seen.get((r.topic, r.partition), '?')})" for r in fenced)
        raise FencedError(f"txn {txn}: a newer epoch already committed to {what}", component=COMPONENT)


def merge_ranges(ranges: Sequence[PartitionRange]) -> list[PartitionRange]:
    """One range per partition: ON CONFLICT DO UPDATE may touch each row once per statement."""
    merged: dict[tuple[str, int], PartitionRange] = {}
    for r in ranges:
        m = merged.get((r.topic, r.partition))
        merged[(r.topic, r.partition)] = r if m is None else PartitionRange(
            r.topic, r.partition, min(m.first_offset, r.first_offset), max(m.last_offset, r.last_offset), max(m.epoch, r.epoch)
        )
    return list(merged.values())


def prepared_manifests(conn: psycopg.Connection[Any]) -> list[tuple[str, str | None, str | None]]:
    """(gid, connector, manifest json) of every prepared ``eosink:`` GID of this database.

    One statement, so one snapshot: a transaction committed meanwhile is either still listed
    with its manifest or gone from both, never reported as a GID without a manifest.
    """
    return conn.execute(
        "SELECT p.gid, m.connector, m.manifest::text FROM pg_prepared_xacts p"
        " LEFT JOIN eosink_txn_manifest m ON m.txn_id = substr(p.gid, %s)"
        " WHERE p.database = current_database() AND starts_with(p.gid, %s) ORDER BY p.prepared, p.gid",
        (len(GID_PREFIX) + 1, GID_PREFIX),
    ).fetchall()


def collect_garbage(conn: psycopg.Connection[Any], connector: str) -> None:
    """Delete the connector's orphaned manifests and old proofs of commit (see the constants)."""
    conn.execute(
        "DELETE FROM eosink_txn_manifest m WHERE connector = %s AND created_at < now() - %s::interval"
        " AND NOT EXISTS (SELECT 1 FROM pg_prepared_xacts p WHERE p.gid = %s || m.txn_id)",
        (connector, ORPHAN_MANIFEST_AGE, GID_PREFIX),
    )
    conn.execute(
        "DELETE FROM eosink_committed_txns c WHERE connector = %s AND committed_at < now() - %s::interval"
        " AND NOT EXISTS (SELECT 1 FROM eosink_offsets o WHERE o.connector = c.connector AND o.txn_id = c.txn_id)",
        (connector, COMMITTED_TXN_RETENTION),
    )


def delete_manifest(conn: psycopg.Connection[Any], txn_id: str) -> None:
    conn.execute("DELETE FROM eosink_txn_manifest WHERE txn_id = %s", (txn_id,))


def is_committed(conn: psycopg.Connection[Any], txn_id: str) -> bool:
    return conn.execute("SELECT 1 FROM eosink_committed_txns WHERE txn_id = %s", (txn_id,)).fetchone() is not None


def read_offsets(conn: psycopg.Connection[Any], connector: str) -> dict[TopicPartition, tuple[int, int]]:
    rows = conn.execute(
        "SELECT topic, partition, epoch, next_offset FROM eosink_offsets WHERE connector = %s", (connector,)
    ).fetchall()
    return {TopicPartition(t, int(p)): (int(e), int(n)) for t, p, e, n in rows}
