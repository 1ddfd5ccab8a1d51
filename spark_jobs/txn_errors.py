"""Which eosink error a failed librdkafka call of a publishing transaction is.

Decided by error code (and the client's own flags: retriable, needs an abort), never by message
text, so a change of librdkafka's wording cannot turn a fenced attempt into a retry.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException

from eosink.spark_jobs.errors import (
    COMPONENT,
    AuthorizationError,
    BrokerUnreachableError,
    PublishError,
    TransactionAbortedError,
    TransactionFencedError,
    TransactionTimeoutError,
)
from eosink.worker.engine.kafka_errors import authorization_error

FENCED_CODES = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
UNREACHABLE_CODES = {KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}


def classify(e: KafkaException, tid: str, bootstrap: str, during: str, settings: dict[str, Any] | None = None) -> Exception:
    """Translate a librdkafka error into eosink's classes (decided by code, never by text)."""
    err: KafkaError = e.args[0]
    refused = authorization_error(err, settings or {}, "WRITE", tid, component=COMPONENT, cls=AuthorizationError,
                                  resource_type="transactional.id" if err.name() == "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"
                                  else None)
    if refused is not None:
        return refused
    code = err.code()
    if code in FENCED_CODES:
        return TransactionFencedError(tid, f"{during}: {err.str()}")
    if code == KafkaError.INVALID_TRANSACTION_TIMEOUT:
        return TransactionTimeoutError(f"the broker rejected the transaction timeout of '{tid}': {err.str()}")
    if code in UNREACHABLE_CODES and during == "init_transactions":
        return BrokerUnreachableError(bootstrap, f"init_transactions of '{tid}': {err.str()}")
    if err.txn_requires_abort():
        return TransactionAbortedError(tid, f"{during}: {err.str()}")
    if err.retriable():
        return BrokerUnreachableError(bootstrap, f"{during} of '{tid}': {err.str()}")
    return PublishError(f"{during} of '{tid}' failed: {err.str()}")
