"""The continuous audit in a real worker (``--audit-interval``): newly decided ranges are checked in the
background, clean ones only counted, and a row doubled behind the product's back before its range is
audited shows in ``eosink_audit_duplicated_total`` (what ``EosinkAuditNotClean`` watches)."""

from __future__ import annotations

from typing import Any

from tests.procs import WorkerProcess, fanout_config, free_port, publish, register, wait_until
from tests.test_audit import _ready
from tests.test_observability import scrape, value

PARTITIONS = 2


def _metric(url: str, name: str, sink: str, connector: str) -> float:
    return value(scrape(url), name, connector=connector, sink=sink) or 0.0


def _rows(pg: Any, table: str) -> int:
    if not pg.execute("SELECT to_regclass(%s)", (f'"{table}"',)).fetchone()[0]:
        return 0
    return int(pg.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])


def test_a_row_doubled_before_its_range_is_audited_is_counted_by_the_continuous_audit(stack, make_topic, unique, pg,
                                                                                      tmp_path):
    topic = make_topic(PARTITIONS)
    name = unique.replace("_", "-")
    bucket = name[:63].strip("-")
    register(stack.zookeeper_hosts, unique, name, fanout_config(stack, unique, topic, tmp_path / "out", bucket))
    w = WorkerProcess(stack, unique, "w-auditor", tmp_path, rest_port=free_port(), extra_args=["--audit-interval", "4"])
    try:
        wait_until(lambda: _ready(w.url), 60, "the worker's REST API")
        first, _ = publish(stack.kafka_bootstrap, topic, PARTITIONS, txns=4, per_txn=100, aborted_every=2, prefix="a")
        wait_until(lambda: _metric(w.url, "eosink_audit_records_total", "db", name) >= len(first), 60,
                   "the first records audited")
        assert _metric(w.url, "eosink_audit_duplicated_total", "db", name) == 0
        second, _ = publish(stack.kafka_bootstrap, topic, PARTITIONS, txns=2, per_txn=100, prefix="b")
        wait_until(lambda: _rows(pg, unique) >= len(first) + len(second), 30, "the second records delivered")
        pg.execute(f'INSERT INTO "{unique}" (id, payload, __topic, __partition, __offset) SELECT id, payload, __topic, '
                   f'__partition, __offset FROM "{unique}" WHERE id = %s', ("b-1",))
        wait_until(lambda: _metric(w.url, "eosink_audit_duplicated_total", "db", name) == 1, 60,
                   "the doubled row counted")
        for sink in ("db", "files", "archive"):
            assert _metric(w.url, "eosink_audit_missing_total", sink, name) == 0, sink
            assert _metric(w.url, "eosink_audit_foreign_total", sink, name) == 0, sink
        assert _metric(w.url, "eosink_audit_duplicated_total", "files", name) == 0
        assert "audit_not_clean" in w.log_text()
    finally:
        assert w.stop() == 0, w.log_text()[-3000:]
