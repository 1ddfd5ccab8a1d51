"""Prometheus metrics of the worker (served on ``/metrics``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CYCLES = Counter("eosink_cycles_total", "Commit cycles by outcome.", ["connector", "outcome"])
RECORDS = Counter("eosink_records_delivered_total", "Records made visible in the sinks.", ["connector"])
BYTES = Counter("eosink_bytes_delivered_total", "Value bytes made visible in the sinks.", ["connector"])
CYCLE_SECONDS = Histogram(
    "eosink_cycle_duration_seconds",
    "Duration of a commit cycle from begin to commit.",
    ["connector"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
STEP_SECONDS = Histogram(
    "eosink_cycle_step_seconds", "Duration of each step of the cycle.", ["connector", "step"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
UNRESOLVED = Gauge(
    "eosink_prepared_unresolved", "Prepared transactions recovery could not resolve (operator needed).", ["connector"]
)
LAG = Gauge("eosink_consumer_lag", "Records behind the high watermark, per partition.", ["connector", "topic", "partition"])
FENCED = Counter("eosink_fenced_attempts_total", "Decisions refused because a newer epoch owns a partition.", ["connector"])
STALE_BATCHES = Counter("eosink_stale_batches_total", "Batches refused because the consumer went back behind the decision log.",
                        ["connector"])
RECOVERED = Counter("eosink_recovered_txns_total", "Prepared transactions resolved by recovery.", ["connector", "action"])
TASK_FAILED = Gauge("eosink_task_failed", "1 while the connector's task on this worker is FAILED.", ["connector"])
DEAD_LETTERED = Counter("eosink_records_dead_lettered_total", "Bad records written to the dead-letter topic.", ["connector"])
TOLERATED = Counter("eosink_records_tolerated_total", "Bad records skipped under errors.tolerance=all, by stage.",
                    ["connector", "stage"])
