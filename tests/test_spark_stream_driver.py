"""The streaming driver's own costs: what it does before a micro-batch's tasks run, and how long that takes.

The exactly-once behaviour of the streaming publishers is in ``test_spark_stream.py``; these tests
pin what makes the driver's share of a micro-batch (and of a query start) short.
"""

from __future__ import annotations

import time

import pytest

from eosink.spark_jobs.fencing import fence

pytestmark = pytest.mark.spark


def test_fencing_does_not_wait_for_librdkafkas_500ms_coordinator_retry(stack, unique):
    """With sparse connections each fencing producer asked for its coordinator before any broker was up, and
    librdkafka asked again only 500 ms later: every query start paid it. Best of three, for a loaded machine."""
    conf = {"bootstrap.servers": stack.kafka_bootstrap}
    took = []
    for attempt in range(3):
        began = time.monotonic()
        assert fence(conf, [f"eosink-{unique}-{attempt}-{p}" for p in range(4)], 30_000) == []
        took.append(time.monotonic() - began)
    assert min(took) < 0.4, f"fencing 4 transactional.ids took {min(took):.2f} s at best"
