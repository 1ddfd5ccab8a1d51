"""The project's own components, one class per real server, listed in start order."""

from __future__ import annotations

from worker.stack.components.base import Component
from worker.stack.components.kafka import Kafka
from worker.stack.components.postgres import Postgres
from worker.stack.components.s3 import S3
from worker.stack.components.zookeeper import ZooKeeper

COMPONENTS: dict[str, type[Component]] = {c.name: c for c in (ZooKeeper, Kafka, Postgres, S3)}

__all__ = ["COMPONENTS", "Component"]
