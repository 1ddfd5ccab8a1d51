"""The S3 sink's resource fence: the highest epoch committed on each partition, in the bucket.

``prepare`` lists ``__epochs__/...`` (while the parts upload: they are invisible) and, when the
manifest's epoch is older than one stored for its partitions, aborts its uploads and raises
FencedError before the ``.json`` exists. ``commit`` raises the stored epoch with a
compare-and-set (``IfMatch`` on the ETag, ``IfNoneMatch`` for the first) so two writers never
lower it; the first attempt starts from the ETag the fence listed (a stale one only loses the
compare-and-set, then the object is read).
"""

from __future__ import annotations

import hashlib

from eosink.connectors.api import formats
from eosink.connectors.api.errors import FatalError, FencedError, RetryableError
from eosink.connectors.api.records import TopicPartition, TxnManifest
from eosink.connectors.s3.client import COMPONENT, CONFLICT, Bucket
from eosink.connectors.s3.layout import Layout

#: The epoch object's user metadata that holds its format (:mod:`eosink.connectors.api.formats`).
FORMAT_METADATA = "eosink-format"


class EpochFence:
    """The epoch objects of one connector's partitions: checked at prepare, raised at commit."""

    def __init__(self, bucket: Bucket, layout: Layout) -> None:
        self.bucket = bucket
        self.layout = layout
        # Lower bounds of the stored epochs (they only grow): commit skips raising what is high enough.
        self._epochs: dict[TopicPartition, int] = {}
        # (epoch, ETag or None when absent) of epoch objects as the last fence saw them: the first
        # compare-and-set of a raise starts from it instead of reading the object again.
        self._fenced: dict[TopicPartition, tuple[int, str | None]] = {}

    def check(self, manifest: TxnManifest) -> None:
        """Refuse a prepare whose epoch is older than one already committed on any of its partitions.

        One LIST of the connector's epoch objects instead of a GET per partition: a plain PUT's
        ETag is the MD5 of its bytes, so an epoch object whose ETag is the MD5 of the epoch this
        instance last saw there has not changed. Only the others are read (all of them where ETags
        are not MD5s, e.g. under SSE-KMS: correct, just one GET each).
        """
        wanted = {self.layout.epoch_key(r.tp): r for r in manifest.ranges}
        etags = {o["Key"]: o.get("ETag", "") for o in self.bucket.objects(self.layout.epochs_dir) if o["Key"] in wanted}
        for key, r in wanted.items():
            etag = etags.get(key)
            known = self._epochs.get(r.tp)
            if etag is None:
                seen = -1
            elif known is not None and etag.strip('"') == hashlib.md5(str(known).encode(), usedforsecurity=False).hexdigest():
                seen = known
            else:
                seen, etag = self._stored_epoch(r.tp)
            self._fenced[r.tp] = (seen, etag)
            self._epochs[r.tp] = max(self._epochs.get(r.tp, -1), seen)
            if r.epoch < seen:
                raise FencedError(f"epoch {r.epoch} for {r.tp} is older than {seen} already committed "
                                  f"(s3://{self.bucket.name}/{key})", component=COMPONENT)

    def _stored_epoch(self, tp: TopicPartition) -> tuple[int, str | None]:
        """(epoch, ETag) of the partition's epoch object; (-1, None) when there is none yet."""
        key = self.layout.epoch_key(tp)
        got = self.bucket.get(key)
        if got is None:
            return -1, None
        found = got[1].get("Metadata", {}).get(FORMAT_METADATA, "1")
        formats.check(int(found) if found.isdigit() else formats.UNREADABLE, formats.S3_EPOCH, "the epoch object",
                      f"s3://{self.bucket.name}/{key}", component=COMPONENT)
        try:
            return int(got[0]), got[1]["ETag"]
        except ValueError:
            raise FatalError(f"s3://{self.bucket.name}/{key} holds {got[0][:40]!r}, not an epoch number",
                             component=COMPONENT) from None

    def stored_at_least(self, tp: TopicPartition, epoch: int) -> bool:
        """Whether the partition's stored epoch is known to be ``epoch`` or newer: then a commit has
        nothing to raise there (the usual cycle, once its owner's first commit raised it), and no
        request or thread of the pool is spent on it."""
        return self._epochs.get(tp, -1) >= epoch

    def raise_epoch(self, tp: TopicPartition, epoch: int) -> None:
        """Compare-and-set the epoch object to ``max(stored, epoch)``; never lowers it."""
        if self.stored_at_least(tp, epoch):
            return
        key = self.layout.epoch_key(tp)
        fenced = self._fenced.pop(tp, None)  # what this prepare's fence saw: a stale one only loses the CAS
        for _ in range(20):
            seen, etag = fenced or self._stored_epoch(tp)
            fenced = None
            if seen >= epoch:
                break
            cond = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
            if self.bucket.call("put_object", key, Key=key, Body=str(epoch).encode(), none_on=CONFLICT,
                                Metadata={FORMAT_METADATA: str(formats.S3_EPOCH)}, **cond) is not None:
                break  # None: another writer changed it since we read it; read again
        else:
            raise RetryableError(f"epoch of {tp} at s3://{self.bucket.name}/{key} keeps changing under us",
                                 component=COMPONENT)
        self._epochs[tp] = max(self._epochs.get(tp, -1), epoch)
