"""The dead-letter manifest: the znode that makes a cycle's dead-letter write recoverable.

``/eosink/<cluster>/deadletter/<connector>/<txn>`` holds the txn's manifest (partitions, epochs)
and, per bad record, one row ``[topic, partition, offset, stage, exception class, message]`` -
not its bytes, which stay on the source topic, so the znode stays small. Whoever completes a
decided write reads the records back from those coordinates (see :mod:`.deadletter`).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from typing import Any

from eosink.connectors.api.errors import FatalError, RetryableError
from eosink.connectors.api.records import TxnManifest
from eosink.worker import paths
from eosink.worker.engine.batch import FailedRecord

COMPONENT = "dead-letter"
#: The largest dead-letter manifest written to ZooKeeper (its default jute.maxbuffer is 1 MiB).
MAX_MANIFEST_BYTES = 900 * 1024
_MESSAGE_CHARS = 1000


def _class_name(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def rows(staged: Sequence[FailedRecord]) -> list[list[Any]]:
    """The manifest's row of each bad record: where it is on the source topic, and why it failed."""
    return [[f.topic, f.partition, f.offset, f.stage, _class_name(f.error), str(f.error)[:_MESSAGE_CHARS]] for f in staged]


class DeadLetterManifests:
    """The dead-letter manifests of one connector's prepared cycles, in ZooKeeper."""

    def __init__(self, session: Any, connector: str) -> None:
        self.session = session
        self.root = paths.deadletter(session.root, connector)

    def prepared(self) -> list[TxnManifest]:
        """The txn manifests of every dead-letter write still in ZooKeeper (prepared, not yet committed or aborted)."""
        from kazoo.exceptions import NoNodeError

        out = []
        try:
            names = self.session.client.get_children(self.root)
        except NoNodeError:
            return []
        for name in sorted(names):
            doc = self.read(name)
            if doc is not None:
                out.append(TxnManifest.from_json(json.dumps(doc["manifest"]), f"the dead-letter manifest {name}"))
        return out

    def write(self, manifest: TxnManifest, worker: str, records: Sequence[Sequence[Any]]) -> None:
        doc = {"manifest": json.loads(manifest.to_json()), "worker": worker, "records": records}
        data = zlib.compress(json.dumps(doc, separators=(",", ":")).encode())
        if len(data) > MAX_MANIFEST_BYTES:
            raise FatalError(f"txn {manifest.txn_id}: {len(records)} bad records make a dead-letter manifest of {len(data)} "
                             "bytes, over ZooKeeper's limit: lower batch.max.records", component=COMPONENT)
        self._write(manifest.txn_id, data)

    def _path(self, txn_id: str) -> str:
        return f"{self.root}/{txn_id}"

    def _write(self, txn_id: str, data: bytes) -> None:
        from kazoo.exceptions import KazooException, NodeExistsError

        try:
            try:
                self.session.client.create(self._path(txn_id), data, makepath=True)
            except NodeExistsError:
                self.session.client.set(self._path(txn_id), data)
        except KazooException as exc:
            raise RetryableError(f"writing the dead-letter manifest of {txn_id}: {exc!r}", component=COMPONENT) from exc

    def read(self, txn_id: str) -> dict[str, Any] | None:
        from kazoo.exceptions import NoNodeError

        try:
            data, _ = self.session.client.get(self._path(txn_id))
        except NoNodeError:
            return None
        return json.loads(zlib.decompress(data))

    def delete(self, txn_id: str) -> None:
        from kazoo.exceptions import NoNodeError

        try:
            self.session.client.delete(self._path(txn_id))
        except NoNodeError:
            pass
