"""Start-up checks a worker makes before it joins the cluster.

ZooKeeper is checked by joining it (the worker fails with the address it could not reach), but a
worker without connectors never talks to Kafka: with a wrong bootstrap address it would idle,
report healthy and only fail once a connector is assigned to it. A container orchestrator needs
the opposite: exit non-zero at once with the address in the message, so the health check fails
and the restart policy (or the operator) takes over.
"""

from __future__ import annotations

import os
import time
from typing import Any

from eosink.connectors.api.errors import ConfigError, RetryableError
from eosink.worker.engine.kafka_errors import ConnectionWatch

DEFAULT_TIMEOUT_S = 30.0


def startup_timeout() -> float:
    raw = os.environ.get("EOSINK_STARTUP_TIMEOUT", "")
    try:
        return float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        raise ConfigError(f"EOSINK_STARTUP_TIMEOUT={raw!r} is not a number of seconds", key="EOSINK_STARTUP_TIMEOUT") from None


def check_kafka(bootstrap: str, settings: dict[str, str], timeout_s: float | None = None) -> None:
    """Raise :class:`RetryableError` naming ``bootstrap`` when no broker answers within the timeout, and a
    fatal :mod:`kafka_errors` error naming the setting when it answers but refuses the login or the TLS handshake
    (a wrong password or CA would otherwise look like an unreachable broker)."""
    from confluent_kafka.admin import AdminClient

    timeout = startup_timeout() if timeout_s is None else timeout_s
    # log_level 0: the refusals librdkafka would print every 50 ms are summed up in the one error below
    conf = {"bootstrap.servers": bootstrap, "log_level": 0, **settings}
    watch = ConnectionWatch(conf, "kafka")
    admin = AdminClient(watch.install(conf))
    md = _metadata(admin, watch, time.monotonic() + timeout, bootstrap, timeout)
    if not md.brokers:
        raise RetryableError(f"Kafka at {bootstrap} listed no brokers within {timeout:.0f} s", component="kafka")


def _metadata(admin: Any, watch: ConnectionWatch, deadline: float, bootstrap: str, timeout: float) -> Any:
    """Cluster metadata, asked in slices of a second: a refused login or handshake is known at once, not at the deadline."""
    from confluent_kafka import KafkaException

    while True:
        try:
            return admin.list_topics(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
        except KafkaException as e:
            watch.check(admin)
            if time.monotonic() >= deadline:
                raise RetryableError(f"cannot reach Kafka at {bootstrap} within {timeout:.0f} s (EOSINK_BOOTSTRAP_SERVERS / "
                                     f"--bootstrap-servers): {e.args[0] if e.args else e}", component="kafka") from None
