"""What the S3 sink keeps in the bucket: every key it writes, and the prepared txn's ``.json``.

The keys are listed, and why they are what they are, in :mod:`.protocol`; a :class:`Prepared`
is read back by any instance that completes or aborts a txn another one prepared.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import quote

from eosink.connectors.api.records import PartitionRange, TopicPartition, TxnManifest


@dataclass(frozen=True, slots=True)
class Staged:
    """One object of a prepared txn: its final key, its open upload, the parts uploaded."""

    key: str
    upload_id: str
    parts: tuple[tuple[int, str], ...]  # (PartNumber, ETag); empty as read from the .json


@dataclass(frozen=True, slots=True)
class Prepared:
    """What the txn's ``.json`` holds: enough for any instance to complete or abort it."""

    manifest: TxnManifest
    ext: str
    staged: tuple[Staged, ...]

    def to_json(self) -> bytes:
        return json.dumps({"manifest": json.loads(self.manifest.to_json()), "ext": self.ext,
                           "uploads": [[s.key, s.upload_id, [list(p) for p in s.parts]] for s in self.staged]},
                          separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str = "a prepared txn's .json") -> Prepared:
        d = json.loads(data)
        staged = tuple(Staged(k, u, tuple((int(n), str(e)) for n, e in ps)) for k, u, ps in d["uploads"])
        return cls(TxnManifest.from_json(json.dumps(d["manifest"]), where), str(d["ext"]), staged)


@dataclass(frozen=True, slots=True)
class Layout:
    """Every key the sink writes, from ``s3.prefix`` and the connector's name."""

    prefix: str
    connector: str

    def key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    @property
    def data_prefix(self) -> str:
        return self.key(self.connector) + "/"

    @property
    def pending_dir(self) -> str:
        return self.key("__pending__", self.connector) + "/"

    def pending_key(self, txn_id: str) -> str:
        return f"{self.pending_dir}{quote(txn_id, safe='')}.json"

    def final_key(self, r: PartitionRange, ext: str) -> str:
        return self.key(self.connector, r.topic, str(r.partition), f"{r.first_offset:020d}-{r.last_offset:020d}.{ext}")

    def partition_prefix(self, tp: TopicPartition) -> str:
        """The prefix of every object (and upload) of ``tp``."""
        return self.key(self.connector, tp.topic, str(tp.partition)) + "/"

    @property
    def epochs_dir(self) -> str:
        return self.key("__epochs__", self.connector) + "/"

    def epoch_key(self, tp: TopicPartition) -> str:
        return f"{self.epochs_dir}{tp.topic}-{tp.partition}"
