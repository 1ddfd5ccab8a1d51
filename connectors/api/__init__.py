"""The sink contract: what the engine calls and every connector implements.

A connector is a :class:`TwoPhaseCommitSink` (or a :class:`BatchingSink`, which buffers staged
records for you) declaring its keys in a :class:`ConfigDef`; it receives :class:`SinkRecord`
batches, makes them durable but invisible in ``pre_commit`` under a :class:`TxnManifest`, and
visible in ``commit``. Failures are raised as one of the outcome classes of ``errors``:
retryable (and its kinds fenced and commit-state-unknown) or fatal. Nothing here imports a
connector or the engine, so a plugin depends on this package alone::

    from eosink.connectors.api import BatchingSink, ConfigDef, SinkRecord, TxnManifest
"""

from eosink.connectors.api.config import MASK, ConfigDef, ConfigKey, Importance, Type, at_least, non_empty, one_of
from eosink.connectors.api.errors import (
    CommitStateUnknownError,
    ConfigError,
    CoordinatorUnavailableError,
    EosinkError,
    FatalError,
    FencedError,
    Outcome,
    RecordError,
    RetryableError,
    outcome_of,
)
from eosink.connectors.api.records import ID_HEADER, PartitionRange, SinkRecord, TopicPartition, TxnManifest
from eosink.connectors.api.sink import BatchingSink, TwoPhaseCommitSink

__all__ = [
    "ID_HEADER", "MASK", "BatchingSink", "CommitStateUnknownError", "ConfigDef", "ConfigError", "ConfigKey",
    "CoordinatorUnavailableError", "EosinkError", "FatalError", "FencedError", "Importance", "Outcome",
    "PartitionRange", "RecordError", "RetryableError", "SinkRecord", "TopicPartition", "TwoPhaseCommitSink",
    "TxnManifest", "Type", "at_least", "non_empty", "one_of", "outcome_of",
]
