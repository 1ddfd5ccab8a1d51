"""The REST API every worker serves (Kafka Connect's paths and shapes): see :mod:`eosink.worker.control.rest.api`."""

from eosink.worker.control.rest.server import RestServer

__all__ = ["RestServer"]
