"""Ending the transactions a failed or stopped micro-batch may have left open, at once.

A task that fails aborts its own transaction. One that is killed (the query stopped mid-batch, an
executor lost, a driver killed with its local executors) cannot: its transaction stays open until
the broker aborts it at ``transaction.timeout.ms``, and until then every read_committed consumer of
its outbox partitions stops at the last stable offset. The streaming publisher's transactional.ids
are one per (job, partition) (:func:`eosink.spark_jobs.naming.stream_transactional_id`), so the
driver, knowing how many partitions the batch had, can run ``init_transactions`` on each of them
(a batch write's, one per (job, run, partition), likewise):
the coordinator aborts whatever is open under that id and fences the attempt that opened it.
What this cannot reach (a partition index the driver never learns of) ends at the short streaming
transaction timeout.

Each id is fenced by a producer of its own, connected to every broker when it starts
(``enable.sparse.connections=false``): with librdkafka's sparse connections its first request for the
transaction coordinator found no broker up and was retried only 500 ms later (measured: fencing 4 ids
took 0.51 s, with every broker connected at start 0.02 s), and the driver pays this before the first
micro-batch of every query start.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import KafkaException, Producer

from eosink.spark_jobs.kafka_checks import client_config

log = logging.getLogger("eosink.spark")

#: The fencing producers' own settings (see the module doc).
FENCING_CONFIG: dict[str, Any] = {"enable.sparse.connections": False}


def fence(kafka: Mapping[str, Any], transactional_ids: Iterable[str], transaction_timeout_ms: int,
          timeout_s: float = 30.0) -> list[str]:
    """Abort the open transaction, if any, of each transactional.id; returns those that could not be
    fenced (logged: their transactions end at their timeout)."""

    def one(tid: str) -> str | None:
        conf = {**client_config(kafka), **FENCING_CONFIG, "transactional.id": tid,
                "transaction.timeout.ms": transaction_timeout_ms}
        try:
            producer = Producer(conf)
            producer.init_transactions(timeout_s)
        except KafkaException as e:
            log.warning("could not end the transaction of %s: %s", tid, e)
            return tid
        close = getattr(producer, "close", None)
        if close is not None:
            close()
        return None

    todo = list(dict.fromkeys(transactional_ids))
    if not todo:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(todo)), thread_name_prefix="eosink-fence") as pool:
        return [t for t in pool.map(one, todo) if t is not None]
