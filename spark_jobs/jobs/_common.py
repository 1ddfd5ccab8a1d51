"""Shared plumbing of the job entry points: arguments, defaults, topics, error reporting."""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

from eosink.connectors.api.errors import ConfigError, EosinkError


def new_run_id() -> str:
    """A fresh run id (UTC time + random suffix); re-use the printed one to re-run idempotently."""
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:6]


def default_bootstrap() -> str | None:
    """The local stack's Kafka, if one is running (``eosink stack up``)."""
    if os.environ.get("EOSINK_KAFKA_BOOTSTRAP"):
        return os.environ["EOSINK_KAFKA_BOOTSTRAP"]
    try:
        from eosink.worker.stack import load_endpoints

        return load_endpoints().kafka_bootstrap
    except Exception:  # noqa: BLE001 - no stack package or no running stack: fall back to the file
        pass
    home = Path(os.environ.get("EOSINK_HOME") or Path.cwd() / ".eosink")
    try:
        return json.loads((home / "endpoints.json").read_text())["kafka"]["bootstrap_servers"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def ensure_topics(bootstrap: str, topics: Iterable[str], partitions: int = 3, timeout_s: float = 30.0) -> list[str]:
    """Create missing topics (auto creation is off on eosink brokers); returns the created ones."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    from eosink.spark_jobs.errors import BrokerUnreachableError

    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        existing = admin.list_topics(timeout=timeout_s).topics
    except KafkaException as e:
        raise BrokerUnreachableError(bootstrap, e.args[0].str()) from None
    missing = [t for t in dict.fromkeys(topics) if t not in existing]
    if not missing:
        return []
    futures = admin.create_topics([NewTopic(t, num_partitions=partitions, replication_factor=-1) for t in missing])
    for f in futures.values():
        try:
            f.result(timeout_s)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    return missing


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-id", help="idempotency key of the run (default: a new one, printed)")
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default: the local stack's)")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    parser.add_argument("--no-create-topics", action="store_true", help="fail instead of creating missing topics")


def main(module: ModuleType, argv: list[str] | None = None, prog: str | None = None) -> int:
    """Parse ``argv`` for ``module``, run it in a SparkSession, print the result as JSON."""
    parser = argparse.ArgumentParser(prog=prog or f"python -m {module.__name__}", description=module.__doc__)
    add_common_arguments(parser)
    module.add_arguments(parser)
    args = parser.parse_args(argv)
    args.run_id = args.run_id or new_run_id()
    args.bootstrap = args.bootstrap or default_bootstrap()
    try:
        if not args.bootstrap:
            raise ConfigError("no Kafka bootstrap servers: pass --bootstrap or start the stack", key="bootstrap")
        from eosink.spark_jobs.session import build_session

        # Outside spark-submit, default to local mode with task retries (plain local[*] never retries).
        master = args.master or (None if "PYSPARK_GATEWAY_PORT" in os.environ else "local[*,4]")
        spark = build_session(f"eosink-{module.NAME}", master=master, kafka_jars=module.needs_kafka_jars(args))
        result = module.run_from_args(spark, args)
    except EosinkError as e:
        print(f"eosink spark {module.NAME}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    print(json.dumps(result, indent=2, sort_keys=True, default=str))
    return 0

