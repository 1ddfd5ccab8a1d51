"""The REST API every worker serves (Kafka Connect's paths and shapes): see :mod:`worker.rest.api`."""

from worker.rest.server import RestServer

__all__ = ["RestServer"]
