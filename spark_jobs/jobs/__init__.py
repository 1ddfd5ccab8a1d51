"""Spark jobs that publish through :func:`spark_jobs.publish_outbox`.

Each job module has ``NAME``, ``add_arguments(parser)``, ``run_from_args(spark, args) -> dict``
and ``needs_kafka_jars(args)``; ``eosink spark run <job>`` (:mod:`eosink.spark_jobs.cli`),
``python -m eosink.spark_jobs.jobs.<job>`` and ``spark-submit spark_jobs/jobs/<job>.py`` all go through
:func:`eosink.spark_jobs.jobs._common.main`.
"""

from __future__ import annotations

JOBS = {
    "orders": "eosink.spark_jobs.jobs.orders",
    "balance_alerts": "eosink.spark_jobs.jobs.balance_alerts",
}
ALIASES = {"balance-alerts": "balance_alerts"}
