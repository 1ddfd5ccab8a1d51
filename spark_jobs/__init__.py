"""eosink's exactly-once Spark outbox publisher.

Spark's own Kafka sink is at-least-once: a retried or speculative task writes its partition again.
:func:`publish_outbox` publishes each partition in one Kafka transaction whose transactional.id is
stable per (job, run, partition), with a publish-ledger entry in the same transaction, so every row
is visible to read_committed consumers exactly once per run id::

    from eosink.spark_jobs import publish_outbox

    result = publish_outbox(df, "orders_outbox", key="order_id", job="orders",
                            run_id="2024-06-01", kafka="127.0.0.1:19092")

Imports are lazy so ``eosink.spark_jobs.errors`` and ``eosink.spark_jobs.naming`` load without pyspark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eosink.spark_jobs.outbox import Outbox
    from eosink.spark_jobs.publisher import PublishResult, publish_outbox
    from eosink.spark_jobs.stream import publish_outbox_stream

__all__ = ["Outbox", "PublishResult", "publish_outbox", "publish_outbox_stream"]


def __getattr__(name: str) -> Any:
    if name in ("publish_outbox", "PublishResult"):
        from eosink.spark_jobs import publisher

        return getattr(publisher, name)
    if name == "publish_outbox_stream":
        from eosink.spark_jobs.stream import publish_outbox_stream

        return publish_outbox_stream
    if name == "Outbox":
        from eosink.spark_jobs.outbox import Outbox

        return Outbox
    raise AttributeError(name)
