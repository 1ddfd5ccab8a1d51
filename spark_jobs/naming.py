"""The names the publisher fixes (see spark_jobs/README.md).

* transactional.id ``eosink-{job}-{run_id}-{partition}``: stable per (job, run, partition) and *not*
  per attempt, so every attempt of a partition, retried, speculative or re-run, shares it and the
  newest one fences the others.
* record headers (``ID_HEADER``/``RUN_HEADER`` of ``eosink.connectors.api.records``):
  ``eosink.id`` = ``{job}/{run_id}/{partition}/{sequence}`` and ``eosink.run`` = run id (a micro-batch's
  partition is ``{index}-{fingerprint of its first rows}``, see ``stream_task``).
* ledger key ``{job}/{run_id}/{partition}``; the run-complete marker uses ``{job}/{run_id}/run``.

Job names and run ids are restricted to ``[A-Za-z0-9._-]``: they end up in transactional.ids, in
ledger keys split on ``/`` and in log lines. Because ``-`` is both allowed and the transactional.id
separator, two different (job, run) pairs can map to the same transactional.id (job ``a-b`` run ``c``
vs job ``a`` run ``b-c``). That costs at most a spurious fencing between two concurrent jobs, never a
duplicate or a loss: the ledger key (split on ``/``) is unambiguous and is what decides.
"""

from __future__ import annotations

import re

from eosink.connectors.api.errors import ConfigError

LEDGER_TOPIC = "__eosink_publish_ledger"
RUN_MARKER = "run"

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")


def validate_name(value: str, what: str) -> str:
    """Return ``value`` or raise :class:`ConfigError` naming ``what`` (``job`` or ``run_id``)."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigError(
            f"{what} must be 1-100 characters of [A-Za-z0-9._-], got {value!r}", key=what, source="publish_outbox"
        )
    return value


def transactional_id(job: str, run_id: str, partition: int) -> str:
    return f"eosink-{job}-{run_id}-{partition}"


def stream_transactional_id(job: str, partition: int) -> str:
    """A streaming query's transactional.id: one per (job, partition), the same for every micro-batch.

    Not one per micro-batch: the broker keeps every transactional.id it has seen for
    ``transactional.id.expiration.ms`` (7 days by default), and a query at one batch a second would
    leave it millions. Batches of one query run one after another, so an attempt of batch *n*
    fencing a late attempt of batch *n-1* only stops a zombie; the ledger key, which carries the
    batch, still decides whether the partition of *this* batch was published.
    """
    return f"eosink-{job}-stream-{partition}"


def stream_run_id(query_id: str, batch_id: int) -> str:
    """The run id of micro-batch ``batch_id`` of the streaming query ``query_id``.

    The query id is kept in the checkpoint (a restart keeps it, a new checkpoint gets a new one) and a
    replayed batch keeps its batch id, so a replay has the run id of the attempt it repeats and the
    ledger recognises what that attempt committed; a new checkpoint starts a new set of run ids.
    """
    return f"{query_id}.{batch_id}"


def parse_stream_run_id(run_id: str) -> tuple[str, int] | None:
    """``(query_id, batch_id)`` of a run id made by :func:`stream_run_id`, else ``None``."""
    query, _, batch = run_id.rpartition(".")
    return (query, int(batch)) if query and batch.isdigit() else None


def record_id_prefix(job: str, run_id: str, partition: int | str) -> str:
    """``eosink.id`` without the sequence; the task appends the sequence per record."""
    return f"{job}/{run_id}/{partition}/"


def ledger_key(job: str, run_id: str, partition: int | str) -> str:
    return f"{job}/{run_id}/{partition}"


def run_marker_key(job: str, run_id: str) -> str:
    return f"{job}/{run_id}/{RUN_MARKER}"


def run_prefix(job: str, run_id: str) -> str:
    """Prefix shared by every ledger key of one run (partition entries and the run marker)."""
    return f"{job}/{run_id}/"
