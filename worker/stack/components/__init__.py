"""The project's own components, one class per real server, listed in start order."""

from __future__ import annotations

from eosink.worker.stack.components.base import Component
from eosink.worker.stack.components.kafka import Kafka
from eosink.worker.stack.components.postgres import Postgres
from eosink.worker.stack.components.registry import Registry
from eosink.worker.stack.components.s3 import S3
from eosink.worker.stack.components.zookeeper import ZooKeeper

COMPONENTS: dict[str, type[Component]] = {c.name: c for c in (ZooKeeper, Kafka, Postgres, S3, Registry)}

__all__ = ["COMPONENTS", "Component"]
