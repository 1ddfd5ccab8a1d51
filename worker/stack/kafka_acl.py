"""The secure stack's Kafka ACLs: the least privileges of the worker and the Spark publisher, as one table.

The broker denies whatever no ACL allows (``allow.everyone.if.no.acl.found=false``); ``admin`` is
the only super user. :data:`GRANTS` is everything else anyone may do. Each grant was found by
experiment (``tests/test_secure_kafka.py`` removes each one in turn and shows what then fails, with
which error), and each has a one-line *why*: the table in docs/operations/security.md is this table.

Names a secure deployment keeps under the granted prefixes:

- outbox topics start with ``outbox.`` (the publisher writes them, the workers read them);
- dead-letter topics start with ``dlq.`` (created by an operator: the worker may not create topics);
- publisher jobs start with ``outbox.`` too, so their transactional.ids (``eosink-<job>-<run>-<partition>``)
  start with ``eosink-outbox.`` and can never collide with the workers' ``eosink-dlq.`` ones;
- the publish ledger is ``__eosink_publish_ledger``, created by the stack (the publisher may not create topics).

Kafka lets READ and WRITE imply DESCRIBE on the same resource, so no grant below is a bare DESCRIBE
where the principal also reads or writes the resource.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

WORKER = "User:eosink-worker"
PUBLISHER = "User:eosink-publisher"

OUTBOX_TOPIC_PREFIX = "outbox."
DLQ_TOPIC_PREFIX = "dlq."
WORKER_GROUP_PREFIX = "eosink-"
DLQ_TRANSACTIONAL_ID_PREFIX = "eosink-dlq."
PUBLISHER_JOB_PREFIX = "outbox."
PUBLISHER_TRANSACTIONAL_ID_PREFIX = f"eosink-{PUBLISHER_JOB_PREFIX}"
LEDGER_TOPIC = "__eosink_publish_ledger"
LEDGER_READER_GROUP = "eosink-ledger-reader"


@dataclass(frozen=True)
class Grant:
    """One ALLOW ACL: ``principal`` may ``operation`` on the ``resource_type`` named ``name`` (``pattern_type``
    LITERAL: that name; PREFIXED: every name starting with it), from any host."""

    principal: str
    resource_type: str  # TOPIC | GROUP | TRANSACTIONAL_ID | CLUSTER
    pattern_type: str  # LITERAL | PREFIXED
    name: str
    operation: str  # READ | WRITE | DESCRIBE | CREATE ...
    why: str

    @property
    def key(self) -> str:
        """A short stable name for tests and logs: ``worker-read-topic-outbox.``."""
        who = self.principal.split(":", 1)[1].removeprefix("eosink-")
        return f"{who}-{self.operation.lower()}-{self.resource_type.lower().replace('_', '-')}-{self.name}"

    def binding(self) -> Any:
        from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

        return AclBinding(ResourceType[self.resource_type], self.name, ResourcePatternType[self.pattern_type],
                          self.principal, "*", AclOperation[self.operation], AclPermissionType.ALLOW)

    def filter(self) -> Any:
        """The filter matching exactly this grant's ACL (what delete_acls takes)."""
        from confluent_kafka.admin import AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

        return AclBindingFilter(ResourceType[self.resource_type], self.name, ResourcePatternType[self.pattern_type],
                                self.principal, "*", AclOperation[self.operation], AclPermissionType.ALLOW)


GRANTS: tuple[Grant, ...] = (
    # -- the sink workers ---------------------------------------------------------------------------
    Grant(WORKER, "TOPIC", "PREFIXED", OUTBOX_TOPIC_PREFIX, "READ",
          "consume the outbox topics (read_committed fetches, watermarks for lag, topics.regex metadata), "
          "and re-read a bad record for the dead-letter topic"),
    Grant(WORKER, "GROUP", "PREFIXED", WORKER_GROUP_PREFIX, "READ",
          "commit offsets to eosink-<connector> for lag tooling, and the dead-letter commit marker "
          "(offsets sent in the dead-letter transaction to its eosink-dlq.* group)"),
    Grant(WORKER, "TOPIC", "PREFIXED", DLQ_TOPIC_PREFIX, "WRITE",
          "produce bad records to the dead-letter topic (errors.tolerance=all)"),
    Grant(WORKER, "TRANSACTIONAL_ID", "PREFIXED", DLQ_TRANSACTIONAL_ID_PREFIX, "WRITE",
          "the dead-letter producer is transactional (eosink-dlq.<connector>.<worker>.<generation>)"),
    # -- the Spark outbox publisher -----------------------------------------------------------------
    Grant(PUBLISHER, "TOPIC", "PREFIXED", OUTBOX_TOPIC_PREFIX, "WRITE",
          "produce the outbox records inside each partition's transaction"),
    Grant(PUBLISHER, "TRANSACTIONAL_ID", "PREFIXED", PUBLISHER_TRANSACTIONAL_ID_PREFIX, "WRITE",
          "one transaction per Spark partition: transactional.id eosink-<job>-<run>-<partition>"),
    Grant(PUBLISHER, "TOPIC", "LITERAL", LEDGER_TOPIC, "WRITE",
          "write the publish-ledger entry in the same transaction, and the run-complete marker"),
    Grant(PUBLISHER, "TOPIC", "LITERAL", LEDGER_TOPIC, "READ",
          "read the ledger after init_transactions() so a retried or re-run partition publishes nothing"),
    Grant(PUBLISHER, "GROUP", "LITERAL", LEDGER_READER_GROUP, "DESCRIBE",
          "the ledger readers only assign(), but librdkafka still looks up their group's coordinator "
          "(FindCoordinator needs DESCRIBE); they never join or commit, so no READ"),
)


def by_key(key: str) -> Grant:
    for g in GRANTS:
        if g.key == key:
            return g
    raise KeyError(f"no grant {key!r}; one of {', '.join(g.key for g in GRANTS)}")


def _admin(config: Mapping[str, Any]) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient(dict(config))


def create(config: Mapping[str, Any], grants: Iterable[Grant] = GRANTS, timeout_s: float = 30.0) -> None:
    """Create the grants' ACLs (creating an existing ACL is a no-op in Kafka: idempotent)."""
    bindings = [g.binding() for g in grants]
    if not bindings:
        return
    admin = _admin(config)  # held until the results are in: a destroyed client fails them (_DESTROY)
    for fut in admin.create_acls(bindings, request_timeout=timeout_s).values():
        fut.result(timeout_s)


def delete(config: Mapping[str, Any], grants: Iterable[Grant], timeout_s: float = 30.0) -> None:
    """Delete exactly these grants' ACLs."""
    bindings = [g.filter() for g in grants]
    if not bindings:
        return
    admin = _admin(config)  # held until the results are in: a destroyed client fails them (_DESTROY)
    for fut in admin.delete_acls(bindings, request_timeout=timeout_s).values():
        fut.result(timeout_s)


def ensure_ledger_topic(config: Mapping[str, Any], timeout_s: float = 30.0) -> None:
    """The publish ledger, made by the stack so the publisher needs no CREATE (same shape as the publisher's own)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    admin = _admin(config)
    if LEDGER_TOPIC in admin.list_topics(timeout=timeout_s).topics:
        return
    new = NewTopic(LEDGER_TOPIC, num_partitions=1, replication_factor=-1, config={"cleanup.policy": "compact"})
    try:
        admin.create_topics([new], request_timeout=timeout_s)[LEDGER_TOPIC].result(timeout_s)
    except KafkaException as e:
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise


def apply(config: Mapping[str, Any], timeout_s: float = 30.0) -> None:
    """What ``eosink stack up`` does on a secure stack, as ``admin``: every grant, and the ledger topic."""
    create(config, GRANTS, timeout_s)
    ensure_ledger_topic(config, timeout_s)


def table() -> str:
    """The grants as a Markdown table (the one docs/operations/security.md shows)."""
    rows = ["| principal | resource | operation | why |", "|---|---|---|---|"]
    for g in GRANTS:
        what = f"{g.resource_type.lower().replace('_', '.')} {'prefix ' if g.pattern_type == 'PREFIXED' else ''}`{g.name}`"
        rows.append(f"| `{g.principal}` | {what} | {g.operation} | {g.why} |")
    return "\n".join(rows)
