"""The HTTP sink audited through the reference server's ledger: a delivery audits clean, and a committed
transaction dropped from (or doubled in) the server's log behind the product's back is named. An
endpoint without a ledger stays NOT AUDITED, with the reason.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from eosink.connectors.http.sink import HttpSink
from tests.procs import publish, register, wait_until
from tests.test_audit import _audit, _sink, _sink_found, _worker
from tests.test_http_sink import ServerProc

PARTITIONS = 3


def test_http_audit_reads_the_ledger_and_names_a_dropped_and_a_doubled_transaction(stack, make_topic, unique, tmp_path):
    topic = make_topic(PARTITIONS)
    name = unique.replace("_", "-")
    committed, aborted = publish(stack.kafka_bootstrap, topic, PARTITIONS, txns=6, per_txn=200, aborted_every=3)
    server = ServerProc(tmp_path / "http").start()
    register(stack.zookeeper_hosts, unique, name, {"connector.class": "http", "topics": topic, "http.url": server.url,
                                                   "commit.interval.ms": "200", "batch.max.records": "150"})
    w = _worker(stack, unique, "w-http", tmp_path)
    try:
        wait_until(lambda: _sink_found(w.url, name, "http") >= len(committed), 120, f"{len(committed)} records posted")
        rc, report, text = _audit(w.url, name)
        assert rc == 0 and report["ok"], text
        assert _sink(report, "http")["totals"]["found_once"] == len(committed), text
        assert aborted
        # Behind the product's back: the second committed txn dropped, the fourth appended again.
        log = server.data_dir / "committed.jsonl"
        lines = log.read_bytes().splitlines(keepends=True)
        dropped, doubled = json.loads(lines[1]), json.loads(lines[3])
        log.write_bytes(b"".join(lines[:1] + lines[2:]) + lines[3])
        rc, report, text = _audit(w.url, name)
    finally:
        assert w.stop() == 0, w.log_text()[-3000:]
        server.kill()
    assert rc == 1 and not report["ok"], text
    http = _sink(report, "http")
    t = http["totals"]
    assert (t["missing"], t["duplicated"], t["extra_copies"], t["foreign"]) == (
        len(dropped["records"]), len(doubled["records"]), len(doubled["records"]), 0), text
    parts = {p["partition"]: p for p in http["partitions"]}
    for kind, txn in (("missing", dropped), ("duplicated", doubled)):
        for _topic, partition, first, _last, _epoch in txn["manifest"]["ranges"]:
            assert parts[partition]["culprits"][kind]["ranges"][0].startswith(str(first)), (kind, text)
    assert "missing: offsets" in text and "duplicated: offsets" in text


class _NoLedger(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # a third-party endpoint: prepare/commit/abort/pending only
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


def test_an_endpoint_without_a_ledger_is_not_audited_with_the_reason():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoLedger)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sink = HttpSink("third-party", {"topics": "t", "http.url": f"http://127.0.0.1:{server.server_address[1]}/api"})
        reader = sink.audit_reader("http")
        try:
            assert reader.limit is not None and "/api/ledger" in reader.limit and "404" in reader.limit, reader.limit
        finally:
            reader.close()
    finally:
        server.shutdown()
        server.server_close()
