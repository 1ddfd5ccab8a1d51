"""``eosink demo --stream`` as a user runs it: a process of its own, its driver SIGKILLed once mid-way, each sink
counted by the demo itself (PostgreSQL, the HTTP reference server, ``pg_prepared_xacts``)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parent.parent


def test_stream_demo_counts_every_balance_change_and_crossing_once_through_a_killed_driver(stack, tmp_path):
    import psycopg
    from confluent_kafka.admin import AdminClient

    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "eosink.worker.clients.cli", "demo", "--stream", "--dir", str(tmp_path),
                           "--kill-at-batch", "1", "--timeout", "150"], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False)
    elapsed = time.monotonic() - started
    out = done.stdout + done.stderr
    table = re.search(r"table (demo_stream_balances_[0-9a-f]+)", out)
    try:
        assert done.returncode == 0, out[-4000:]
        assert "RESULT: OK - exactly once" in out
        assert "driver SIGKILLed mid-way            : 1 time(s)" in out
        assert re.search(r"PostgreSQL rows +: 15 \(15 distinct, 0 duplicates, 0 missing\)", out), out[-2000:]
        assert "alerts at the HTTP server           : 2 [('u-0', 1200.0), ('u-1', 1200.0)]" in out
        assert "prepared transactions left (PG)     : 0" in out
        assert elapsed < 180, f"the demo took {elapsed:.0f} s"
    finally:
        if table:
            tag = table.group(1).rsplit("_", 1)[1]
            with psycopg.connect(stack.postgres_dsn, autocommit=True) as conn:
                conn.execute(f'DROP TABLE IF EXISTS "{table.group(1)}"')
            admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
            for f in admin.delete_topics([f"demo-stream-{kind}-{tag}" for kind in ("txns", "balances", "alerts")]).values():
                f.result(30)
