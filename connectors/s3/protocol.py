"""The S3 sink's two phases are S3's own: a multipart upload is invisible until it completes.

Layout in the bucket under ``s3.prefix`` (``P``; keys start at the bucket root when empty)::

    P/<connector>/<topic>/<partition>/<first:020d>-<last:020d>.<ext>  visible data (final keys)
    P/__pending__/<connector>/<txn>.json                               a prepared txn (written LAST)
    P/__epochs__/<connector>/<topic>-<partition>                       highest epoch committed there

**prepare** = CreateMultipartUpload at each partition's *final* key + UploadPart(s), in parallel
(parts of ``s3.part.size``, >= 5 MiB but the last); nothing is visible, whatever size. Alongside
the parts, one small object, the txn's ``.json``: its manifest and per object the upload id.
The bodies (JSON Lines or Parquet) are encoded while the creates' round trips run: ``write``
only grouped the slices of the batch by partition (:mod:`.staging`).

**Why no upload begins before prepare** (as Flink's S3 writer streams its parts while a
checkpoint is open). An object's key ends in its last offset, which only the manifest handed to
``pre_commit`` knows, and S3 fixes an upload's key at its create; and at the usual size (a few MB
per partition per cycle) no object fills S3's least part of 5 MiB before then anyway. So every
upload begins in prepare, and what ``abort`` and ``recover`` find is what they always found: a
txn that never reached ``pre_commit`` has nothing in S3 (its staged records are dropped), and an
upload of a prepare that died before its ``.json`` is an orphan that ``recover`` aborts (below).
**commit** = CompleteMultipartUpload per object: S3 makes each object appear whole, at once.
**abort** = AbortMultipartUpload. **recover** = the ``.json`` objects under the connector's
``__pending__/`` plus ListMultipartUploads under its data prefix (which uploads are still open).

**Why the ``.json`` alongside the parts, not after them.** It costs no round trip of its own
(it goes up as soon as the creates answered), and listing a half-uploaded txn is harmless: the
engine decides a txn only after ``pre_commit`` returned, so ``recover`` may list one whose parts
were still uploading when its worker died, and no decision names it: the engine aborts it. A
commit therefore only ever sees whole uploads; an instance that did not prepare the txn reads
the parts' ETags back with ListParts. A prepare that dies before its ``.json`` leaves uploads no
``.json`` names. The task that acquires their partition aborts them at once
(``discard_unprepared``): it holds the partition at a newer epoch, so whoever made them is dead or
fenced. ``recover`` aborts any other once it is :data:`ORPHAN_AGE_S` old (a younger one, on a
partition another task holds, may be a live prepare of that task).

**Why deterministic final keys.** The key is derived from the offsets alone, so a batch
re-delivered by a new owner completes onto the same object with the same bytes instead of adding
a duplicate.

**Idempotent commit, told apart from a lost upload.** Completing an upload twice answers
NoSuchUpload, and so does completing one that S3 aborted. The final object's user metadata
names the txn that wrote it (``eosink-txn``, set at CreateMultipartUpload): when it names this
txn, the commit already happened; when it does not, the prepared data is gone - in practice a
bucket lifecycle rule ``AbortIncompleteMultipartUpload`` shorter than a prepared txn's life -
and the commit is a FatalError that says so. After a commit the ``.json`` is deleted in the
background, those of several commits in one DeleteObjects (it only tidies a committed txn); a
crash before that is finished by ``recover``, which completes whatever is still open of a txn of
which any object is already complete (a complete only ever follows the engine's commit decision).

**The resource fence** (the highest epoch committed on each partition: checked by prepare, raised
by commit) is in :mod:`.fence`; the background deletes of committed txns' ``.json``, in :mod:`.cleanup`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

from eosink.connectors.api.errors import EosinkError, FatalError, RetryableError
from eosink.connectors.api.records import TopicPartition, TxnManifest
from eosink.connectors.s3.cleanup import Cleanup
from eosink.connectors.s3.client import MISSING, STALE_PARTS, Bucket
from eosink.connectors.s3.encoding import CONTENT_TYPES
from eosink.connectors.s3.fence import EpochFence
from eosink.connectors.s3.layout import Layout, Prepared, Staged

COMPONENT = "s3"
MIB = 1024 * 1024
#: Threads for the small requests (fence listing, epoch raises, cleanup).
BOOKKEEPING_THREADS = 2
#: S3's limit of parts per multipart upload.
MAX_PARTS = 10_000
#: Age after which an upload no prepared txn names is garbage, not a prepare in flight.
ORPHAN_AGE_S = 3600.0
T = TypeVar("T")


@dataclass(slots=True)
class CycleTimings:
    """Milliseconds of the last cycle's phases (for metrics and the benchmark)."""

    group_ms: float = 0.0  # the batch's records per partition (in write)
    body_ms: float = 0.0  # the objects' bodies encoded (in prepare, while the creates are in flight)
    prepare_ms: float = 0.0  # creates, bodies, parts, epoch reads, the txn's .json
    creates_ms: float = 0.0  # from the prepare's start until its last create answered (no part goes before)
    commit_ms: float = 0.0  # completes, epoch raises


class MultipartTxns:
    """prepare / commit / abort / recover of one connector's txns in one bucket (see module doc)."""

    def __init__(self, bucket: Bucket, layout: Layout, *, part_size: int, concurrency: int) -> None:
        self.bucket = bucket
        self.layout = layout
        self.part_size = part_size
        self._data = ThreadPoolExecutor(concurrency, thread_name_prefix=f"s3-{layout.connector}")
        # Small requests get threads of their own, so they never queue behind megabytes of data.
        self._small = ThreadPoolExecutor(BOOKKEEPING_THREADS, thread_name_prefix=f"s3-{layout.connector}-small")
        # Prepared by this instance: commit skips reading the .json back.
        self._prepared: dict[str, Prepared] = {}
        self.fence = EpochFence(bucket, layout)
        self.cleanup = Cleanup(bucket, layout.connector, self._small)
        self.timings = CycleTimings()

    def close(self) -> None:
        self.cleanup.tidy(force=True)
        self._small.shutdown(wait=True)  # background cleanups included
        self.cleanup.reap()
        self._data.shutdown(wait=True)

    # -- prepare ----------------------------------------------------------------------------
    def prepare(self, manifest: TxnManifest, bodies: Callable[[], Iterable[bytes]], ext: str) -> None:
        """The objects of ``manifest.ranges`` (in that order): creates first (they need no body),
        then every part; the fence's LIST and the txn's ``.json`` (once the creates answered) run
        alongside. ``bodies()`` encodes the objects (JSON Lines or Parquet), one by one as it is
        iterated, while the creates' round trips run: no part could go before them anyway (see
        :mod:`.staging`)."""
        t0 = time.perf_counter()
        txn = manifest.txn_id
        meta = {"eosink-txn": quote(txn, safe=""), "eosink-connector": self.layout.connector}
        ctype = CONTENT_TYPES[ext]
        keys = [self.layout.final_key(r, ext) for r in manifest.ranges]
        # Not waited for before uploading: an unfinished upload is invisible, so a fenced prepare only
        # aborts it again, and an unfenced one (every one but a zombie's) saves a round trip.
        answered: list[float] = []  # when each create answered (for the timings)
        creates = [self._data.submit(self._create, key, {**meta, "eosink-epoch": str(r.epoch)}, ctype, answered)
                   for key, r in zip(keys, manifest.ranges)]
        fence = self._small.submit(self.fence.check, manifest)
        record = self._small.submit(self._put_record, manifest, ext, keys, creates)
        parts: list[list[Future[tuple[int, str]]]] = []
        try:
            try:
                # An object's parts go out as soon as its body is made (and its create answered),
                # while the next body is encoded: the JSON Lines join copies with the GIL released,
                # so the upload threads and the encoding overlap.
                made = bodies()
                for key, create, r, data in zip(keys, creates, manifest.ranges, made, strict=True):
                    n = max(1, math.ceil(len(data) / self.part_size))
                    if n > MAX_PARTS:
                        raise FatalError(f"txn {txn}: {len(data)} bytes for {r.tp} need {n} parts of s3.part.size="
                                         f"{self.part_size}, over S3's {MAX_PARTS}; raise s3.part.size", component=COMPONENT)
                    ps = self.part_size
                    parts.append([self._data.submit(self._upload_part, key, create, i + 1,
                                                    data if n == 1 else data[i * ps:(i + 1) * ps]) for i in range(n)])
            finally:
                inflight: list[Future[Any]] = [fence, record, *creates, *(f for ps_ in parts for f in ps_)]
                wait(inflight)  # nothing in flight past here
            _settle([fence])
            ids = _settle(creates)
            staged = tuple(Staged(key, uid, tuple(_settle(ps_))) for key, uid, ps_ in zip(keys, ids, parts))
            _settle([record])
            prepared = Prepared(manifest, ext, staged)
        except BaseException:
            # A zombie, a bad record or a failed request leaves nothing behind: the uploads aborted,
            # then the .json deleted (a crash in between leaves a txn recover lists and the engine
            # aborts; an upload that cannot be aborted now is an orphan that recover collects).
            created = [(key, f.result()) for key, f in zip(keys, creates) if f.done() and f.exception() is None]
            try:
                self._parallel(lambda ku: self._abort_upload(*ku), created)
                if record.exception() is None:
                    self.bucket.delete([self.layout.pending_key(txn)])
            except EosinkError:
                pass
            raise
        self._prepared[txn] = prepared
        self.timings = CycleTimings(prepare_ms=(time.perf_counter() - t0) * 1000,
                                    creates_ms=(max(answered, default=t0) - t0) * 1000)

    def _put_record(self, manifest: TxnManifest, ext: str, keys: list[str], creates: list[Future[str]]) -> None:
        ids = [f.result() for f in creates]  # the creates run first on the data threads
        record = Prepared(manifest, ext, tuple(Staged(key, uid, ()) for key, uid in zip(keys, ids)))
        pkey = self.layout.pending_key(manifest.txn_id)
        self.bucket.call("put_object", pkey, Key=pkey, Body=record.to_json(), ContentType="application/json")

    def _create(self, key: str, metadata: dict[str, str], ctype: str, answered: list[float]) -> str:
        uid = str(self.bucket.call("create_multipart_upload", key, Key=key, Metadata=metadata,
                                   ContentType=ctype)["UploadId"])
        answered.append(time.perf_counter())
        return uid

    def _upload_part(self, key: str, create: Future[str], n: int, body: bytes) -> tuple[int, str]:
        upload_id = create.result()  # queued after its create (FIFO pool): at most one create's wait
        resp = self.bucket.call("upload_part", key, Key=key, UploadId=upload_id, PartNumber=n, Body=body)
        return n, str(resp["ETag"])

    # -- commit -----------------------------------------------------------------------------
    def commit(self, txn_id: str) -> None:
        t0 = time.perf_counter()
        prepared = self._prepared.get(txn_id) or self._load(txn_id)
        if prepared is None:
            return  # committed and cleaned up, aborted, or never prepared here: nothing to do
        self._complete_all(prepared)
        self._prepared.pop(txn_id, None)
        self.cleanup.committed(self.layout.pending_key(txn_id))
        self.timings.commit_ms = (time.perf_counter() - t0) * 1000

    def _complete_all(self, prepared: Prepared) -> None:
        txn = prepared.manifest.txn_id
        epochs = [self._small.submit(self.fence.raise_epoch, r.tp, r.epoch) for r in prepared.manifest.ranges
                  if not self.fence.stored_at_least(r.tp, r.epoch)]
        completes = [self._data.submit(self._complete, txn, s) for s in prepared.staged]
        inflight: list[Future[Any]] = [*completes, *epochs]
        wait(inflight)
        lost = [s for s in _settle(completes) if s is not None]
        if lost:
            s = lost[0]
            raise FatalError(
                f"commit {txn}: multipart upload {s.upload_id} of s3://{self.bucket.name}/{s.key} is gone and that "
                "object was not written by this txn: the prepared batch is lost. Was it aborted by a bucket lifecycle "
                "rule AbortIncompleteMultipartUpload shorter than a prepared txn can wait for its commit? Lengthen or "
                "remove that rule (docs/operations/runbooks.md: 'Prepared S3 uploads vanished')", component=COMPONENT)
        _settle(epochs)

    def _complete(self, txn_id: str, s: Staged) -> Staged | None:
        """Complete one upload; None when the object is (now or already) this txn's, ``s`` when lost.

        InvalidPart is not taken as the answer: MinIO gives it for a complete retried after the
        server restarted mid-complete, and transiently for parts it has stored. When the object is
        not (yet) this txn's and the upload still lists its parts, the commit is retried
        (RetryableError); an upload that is gone is lost, as for NoSuchUpload.
        """
        listed = s.parts or self._list_parts(s)
        if listed is None:  # the upload is gone
            return None if self._written_by(txn_id, s.key) else s
        parts = {"Parts": [{"PartNumber": n, "ETag": etag} for n, etag in listed]}
        if self.bucket.call("complete_multipart_upload", s.key, Key=s.key, UploadId=s.upload_id, MultipartUpload=parts,
                            none_on=MISSING | STALE_PARTS) is not None:
            return None
        if self._written_by(txn_id, s.key):
            return None
        still = self._list_parts(s)
        if still is None:
            return s
        raise RetryableError(
            f"commit {txn_id}: complete of multipart upload {s.upload_id} of s3://{self.bucket.name}/{s.key} at "
            f"{self.bucket.endpoint} was refused (InvalidPart) while the upload lists {len(still)} part(s) "
            f"(prepared: {len(listed)}): retrying the commit", component=COMPONENT)

    def _list_parts(self, s: Staged) -> tuple[tuple[int, str], ...] | None:
        """The upload's parts as S3 has them (for a txn another instance prepared); None when gone."""
        out: list[tuple[int, str]] = []
        marker = 0
        while True:
            page = self.bucket.call("list_parts", s.key, Key=s.key, UploadId=s.upload_id, PartNumberMarker=marker,
                                    none_on=MISSING)
            if page is None:
                return None
            out += [(int(p["PartNumber"]), str(p["ETag"])) for p in page.get("Parts", [])]
            if not page.get("IsTruncated"):
                return tuple(out)
            marker = int(page["NextPartNumberMarker"])

    def _written_by(self, txn_id: str, key: str) -> bool:
        head = self.bucket.call("head_object", key, Key=key, none_on=MISSING)
        return head is not None and head.get("Metadata", {}).get("eosink-txn") == quote(txn_id, safe="")

    # -- abort / recover --------------------------------------------------------------------
    def abort(self, txn_id: str) -> None:
        prepared = self._prepared.pop(txn_id, None) or self._load(txn_id)
        if prepared is None:
            return  # aborted or committed already, or its prepare never finished (orphans: see recover)
        self._parallel(lambda s: self._abort_upload(s.key, s.upload_id), prepared.staged)
        self.bucket.delete([self.layout.pending_key(txn_id)])  # last: a crash before it aborts again

    def _abort_upload(self, key: str, upload_id: str) -> None:
        self.bucket.call("abort_multipart_upload", key, Key=key, UploadId=upload_id, none_on=MISSING)

    def recover(self) -> list[TxnManifest]:
        self.cleanup.tidy(force=True)
        self.cleanup.reap(block=True)  # not to race this instance's own background deletes
        found = [p for p in map(self._load_key, self._pending_keys()) if p is not None]
        open_uploads = {u["UploadId"]: u for u in self.bucket.uploads(self.layout.data_prefix)}
        out: list[TxnManifest] = []
        for p in found:
            txn = p.manifest.txn_id
            still_open = [self._is_open(s, open_uploads) for s in p.staged]
            if all(still_open):
                out.append(p.manifest)
            elif any(self._written_by(txn, s.key) for s, o in zip(p.staged, still_open) if not o):
                # Completed, at least in part: the engine decided commit. Finish it and tidy up.
                self._complete_all(p)
                self.bucket.delete([self.layout.pending_key(txn)])
            else:
                out.append(p.manifest)  # prepared, uploads gone: abort tidies it, commit reports the loss
        named = {s.upload_id for p in found for s in p.staged}
        now = time.time()
        orphans = [(u["Key"], uid) for uid, u in open_uploads.items()
                   if uid not in named and now - u["Initiated"].timestamp() > ORPHAN_AGE_S]
        self._parallel(lambda ku: self._abort_upload(*ku), orphans)
        return out

    def discard_unprepared(self, partitions: frozenset[TopicPartition]) -> None:
        """Abort the uploads on ``partitions`` that no prepared txn's ``.json`` names (see the module doc).

        Uploads are listed before the ``.json`` objects, so a prepare that finished in between is
        named; one that finishes later is a fenced writer's, which the engine never commits.
        """
        if not partitions:
            return
        prefixes = tuple(self.layout.partition_prefix(tp) for tp in partitions)
        uploads = [(u["Key"], u["UploadId"]) for u in self.bucket.uploads(self.layout.data_prefix)
                   if str(u["Key"]).startswith(prefixes)]
        if not uploads:
            return
        named = {s.upload_id for p in map(self._load_key, self._pending_keys()) if p is not None for s in p.staged}
        orphans = [(key, uid) for key, uid in uploads if uid not in named]
        self._parallel(lambda ku: self._abort_upload(*ku), orphans)

    def _is_open(self, s: Staged, listed: dict[str, Any]) -> bool:
        if s.upload_id in listed:
            return True
        # Not listed: confirm with the upload itself (a listing may lag behind a create).
        return self.bucket.call("list_parts", s.key, Key=s.key, UploadId=s.upload_id, MaxParts=1,
                                none_on=MISSING) is not None

    def _pending_keys(self) -> Iterable[str]:
        return (o["Key"] for o in self.bucket.objects(self.layout.pending_dir) if o["Key"].endswith(".json"))

    def _load(self, txn_id: str) -> Prepared | None:
        return self._load_key(self.layout.pending_key(txn_id))

    def _load_key(self, key: str) -> Prepared | None:
        got = self.bucket.get(key)
        if got is None:
            return None
        try:
            return Prepared.from_json(got[0], f"s3://{self.bucket.name}/{key}")
        except (ValueError, KeyError, TypeError) as exc:
            raise FatalError(f"s3://{self.bucket.name}/{key} is not a prepared txn: {exc!r}", component=COMPONENT) from None

    def _parallel(self, fn: Callable[[Any], T], items: Iterable[Any]) -> list[T]:
        return _settle([self._small.submit(fn, x) for x in items])


def _settle(futures: list[Future[T]]) -> list[T]:
    """Wait for every future, then raise the first failure: never leave a request in flight."""
    wait(futures)
    return [f.result() for f in futures]
