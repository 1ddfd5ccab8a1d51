"""Errors of the Spark outbox publisher, classified like the rest of eosink.

Every class subclasses :mod:`eosink.connectors.api.errors`, so callers decide by class (retry, rejoin, stop)
and never by message. Messages name the thing the operator must look at: the missing column and
the available ones, the bootstrap servers that did not answer, the transactional.id that was fenced.

These errors are raised inside Spark tasks, where Spark turns them into a ``PythonException`` whose
text ends with ``eosink.spark_jobs.errors.<Class>: <message>``; :func:`from_task_failure` rebuilds the
original class on the driver so ``publish_outbox`` fails with the same clear error a local call
would have raised.
"""

from __future__ import annotations

import re

from eosink.connectors.api.errors import ConfigError, EosinkError, FatalError, FencedError, RetryableError
from eosink.worker.engine.kafka_errors import KafkaAuthenticationError, KafkaAuthorizationError, KafkaTlsError

COMPONENT = "spark-publisher"


class MissingColumnError(ConfigError):
    """The DataFrame has no column of that name (key, value, when or header column)."""

    def __init__(self, column: str, available: list[str], *, role: str = "key") -> None:
        super().__init__(
            f"the DataFrame has no {role} column '{column}'; available columns: {', '.join(available) or '(none)'}",
            key=role,
            source="publish_outbox",
        )
        self.column = column
        self.available = available


class BrokerUnreachableError(RetryableError):
    """No broker of ``bootstrap.servers`` answered in time."""

    def __init__(self, bootstrap: str, detail: str = "") -> None:
        super().__init__(
            f"Kafka at bootstrap.servers={bootstrap!r} is unreachable" + (f": {detail}" if detail else ""),
            component=COMPONENT,
        )
        self.bootstrap = bootstrap


class TopicMissingError(FatalError):
    """An outbox topic does not exist (auto topic creation is off on eosink brokers)."""

    def __init__(self, topics: list[str], bootstrap: str) -> None:
        super().__init__(
            f"outbox topic(s) {', '.join(sorted(topics))} do not exist on {bootstrap}; create them first "
            "(auto topic creation is off)",
            component=COMPONENT,
        )
        self.topics = topics


class TransactionFencedError(FencedError):
    """A newer attempt of the same (job, run, partition) initialised the same transactional.id."""

    def __init__(self, transactional_id: str, detail: str = "") -> None:
        super().__init__(
            f"transactional.id '{transactional_id}' was fenced by a newer attempt of the same partition; "
            "this attempt's transaction is aborted and nothing it produced is visible"
            + (f" ({detail})" if detail else ""),
            component=COMPONENT,
        )
        self.transactional_id = transactional_id


class TransactionTimeoutError(ConfigError):
    """``transaction.timeout.ms`` is above the broker's ``transaction.max.timeout.ms`` (or nonsensical)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, key="transaction.timeout.ms", source="publish_outbox")


class TaskTooLongError(FatalError):
    """A partition took too long for one transaction; the coordinator would abort it under us."""

    def __init__(self, transactional_id: str, elapsed_s: float, timeout_ms: int, records: int) -> None:
        super().__init__(
            f"transaction of '{transactional_id}' has been open {elapsed_s:.1f}s after {records} records, over the "
            f"safety budget of transaction.timeout.ms={timeout_ms}; aborted. Use more, smaller partitions "
            "(publish_outbox(..., partitions=N)) or raise transaction_timeout_ms up to the broker's "
            "transaction.max.timeout.ms",
            component=COMPONENT,
        )
        self.transactional_id = transactional_id


class TransactionAbortedError(RetryableError):
    """The transaction hit an abortable error (a record could not be delivered); it was aborted."""

    def __init__(self, transactional_id: str, detail: str) -> None:
        super().__init__(f"transaction of '{transactional_id}' aborted: {detail}", component=COMPONENT)
        self.transactional_id = transactional_id


class LedgerError(RetryableError):
    """The publish ledger could not be read up to its end in time, so the partition is not published."""

    def __init__(self, message: str) -> None:
        super().__init__(message, component=COMPONENT)


class PartitioningChangedError(FatalError):
    """A run id was partly published with a different number of partitions than this execution has.

    For a streaming query the run is a micro-batch and this execution its replay after a restart;
    ``advice`` then says what to keep unchanged instead of suggesting a new run id.
    """

    BATCH_ADVICE = "Re-run with the same input and partitions=..., or use a new run_id"
    STREAM_ADVICE = (
        "A replayed micro-batch must split its rows as the attempt it repeats did: restart with the partitioning "
        "unchanged (publish_outbox_stream(partitions=N), spark.sql.shuffle.partitions, the source's partitions) "
        "until this batch has completed; a new checkpoint needs a new job name"
    )

    def __init__(self, job: str, run_id: str, recorded: int, now: int, advice: str = BATCH_ADVICE) -> None:
        super().__init__(
            f"run '{job}/{run_id}' was partly published with {recorded} partitions but this execution has {now}; "
            f"the ledger is per partition, so resuming with another partitioning could duplicate records. {advice}",
            component=COMPONENT,
        )


class ReplayRegroupedError(FatalError):
    """A replayed micro-batch puts rows an earlier attempt committed into other groups than that attempt did.

    Raised by the task before its transaction commits (it commits nothing): some of the partition's rows
    are committed inside a group the partition only partly holds, so publishing it would duplicate them
    and skipping it could lose the others. The batch completes once it is replayed with the grouping of
    the attempt that committed first.
    """

    ADVICE = (
        "restart the query with the partitioning that attempt had (the Kafka source's minPartitions, the partition "
        "count of a repartition or of spark.sql.shuffle.partitions in a stateless query) until this batch has "
        "completed, or publish with publish_outbox_stream(partitions=N), which refuses a changed count before "
        "anything is published"
    )

    def __init__(self, job: str, run_id: str, partition: int, detail: str) -> None:
        query, _, batch = run_id.rpartition(".")
        super().__init__(
            f"micro-batch {batch} of query {query} (job '{job}'), partition {partition}: {detail}; its transaction is "
            f"aborted, nothing of it is visible. The replay groups the batch's rows differently from the attempt "
            f"that committed part of it: {self.ADVICE}",
            component=COMPONENT,
        )
        self.job, self.run_id, self.partition = job, run_id, partition


class UnsupportedTypeError(ConfigError):
    """A value column's Spark type has no Avro mapping (or its name is not a valid Avro name)."""

    def __init__(self, column: str, detail: str) -> None:
        super().__init__(f"value column '{column}' cannot be written as Avro: {detail}", key="value",
                         source="publish_outbox")
        self.column = column


class RegistryUnreachableError(RetryableError):
    """The schema registry did not answer (connection refused, timeout, DNS, 5xx): nothing was published."""

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(f"the schema registry at schema.registry.url={url!r} is not reachable: {detail}; "
                         "nothing was published", component=COMPONENT)
        self.url = url


class SchemaRejectedError(FatalError):
    """The registry refused the derived schema for the subject (incompatible, invalid, or not authorised)."""

    def __init__(self, subject: str, url: str, detail: str) -> None:
        super().__init__(f"the schema registry at {url} refused the Avro schema for subject '{subject}': {detail}; "
                         "nothing was published", component=COMPONENT)
        self.subject = subject


class PublishError(FatalError):
    """Any other non-retriable failure of the publisher (a fatal producer error, bad configuration)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, component=COMPONENT)


class AuthorizationError(KafkaAuthorizationError):
    """The broker's ACLs refuse the publisher an operation (WRITE on an outbox or the ledger, its transactional.id,
    READ on the ledger): fatal, names the librdkafka error, the principal, the operation and the resource."""


class AuthenticationError(KafkaAuthenticationError):
    """The broker refused the publisher's SASL login (check sasl.username / sasl.password)."""


class TlsError(KafkaTlsError):
    """The TLS handshake failed (check ssl.ca.location)."""


_REMOTE = re.compile(r"spark_jobs\.errors\.(\w+): (.*)")


def from_task_failure(exc: BaseException) -> EosinkError | None:
    """Rebuild the error a Spark task raised from the text of the job failure, or ``None``.

    Only the last ``eosink.spark_jobs.errors.X: message`` line counts (the most recent task failure).
    The instance is built without calling the subclass constructor, whose arguments are gone.
    """
    matches = _REMOTE.findall(str(exc))
    if not matches:
        return None
    name, message = matches[-1]
    cls = globals().get(name)
    if not (isinstance(cls, type) and issubclass(cls, EosinkError)):
        return None
    prefix = f"[{COMPONENT}] "
    message = message.strip()
    if message.startswith(prefix):
        message = message[len(prefix) :]
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.message = message
    err.component = COMPONENT
    err.log_file = None
    return err


__all__ = [
    "AuthenticationError",
    "AuthorizationError",
    "TlsError",
    "BrokerUnreachableError",
    "LedgerError",
    "MissingColumnError",
    "PartitioningChangedError",
    "PublishError",
    "RegistryUnreachableError",
    "ReplayRegroupedError",
    "SchemaRejectedError",
    "UnsupportedTypeError",
    "TaskTooLongError",
    "TopicMissingError",
    "TransactionAbortedError",
    "TransactionFencedError",
    "TransactionTimeoutError",
    "from_task_failure",
]
