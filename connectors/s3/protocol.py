"""The S3 sink's two phases are S3's own: a multipart upload is invisible until it completes.

Layout in the bucket under ``s3.prefix`` (``P``; keys start at the bucket root when empty)::

    P/<connector>/<topic>/<partition>/<first:020d>-<last:020d>.<ext>  visible data (final keys)
    P/__pending__/<connector>/<txn>.json                               a prepared txn (written LAST)
    P/__epochs__/<connector>/<topic>-<partition>                       highest epoch committed there

**prepare** = CreateMultipartUpload at each partition's *final* key + UploadPart(s), in parallel
(parts of ``s3.part.size``, >= 5 MiB but the last); nothing is visible, whatever size. Alongside
the parts, one small object, the txn's ``.json``: its manifest and per object the upload id.
The JSON Lines bodies are encoded before, by the sink's ``write`` as the engine hands over the
slices of the batch (:mod:`.staging`); the prepare joins them.

**Why no upload begins before prepare** (as Flink's S3 writer streams its parts while a
checkpoint is open). An object's key ends in its last offset, which only the manifest handed to
``pre_commit`` knows, and S3 fixes an upload's key at its create; and at the usual size (a few MB
per partition per cycle) no object fills S3's least part of 5 MiB before then anyway. So every
upload begins in prepare, and what ``abort`` and ``recover`` find is what they always found: a
txn that never reached ``pre_commit`` has nothing in S3 (its staged lines are dropped), and an
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
``.json`` names: ``recover`` aborts those once they are :data:`ORPHAN_AGE_S` old (younger ones
may be a live prepare of another task of the same connector).

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

**The resource fence.** ``prepare`` lists ``__epochs__/...`` (while the parts upload: they are
invisible) and, when the manifest's epoch is older than one stored for its partitions, aborts
its uploads and raises FencedError before the ``.json`` exists. ``commit`` raises the stored
epoch with a compare-and-set (``IfMatch`` on the ETag, ``IfNoneMatch`` for the first) so two
writers never lower it; the first attempt starts from the ETag the fence listed (a stale one only
loses the compare-and-set, then the object is read).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import structlog

from eosink.connectors.api.errors import EosinkError, FatalError, FencedError, RetryableError
from eosink.connectors.api.records import PartitionRange, TopicPartition, TxnManifest
from eosink.connectors.s3.client import CONFLICT, MISSING, Bucket
from eosink.connectors.s3.encoding import CONTENT_TYPES

COMPONENT = "s3"
MIB = 1024 * 1024
#: Threads for the small requests (fence listing, epoch raises, cleanup).
BOOKKEEPING_THREADS = 2
#: S3's limit of parts per multipart upload.
MAX_PARTS = 10_000
#: Age after which an upload no prepared txn names is garbage, not a prepare in flight.
ORPHAN_AGE_S = 3600.0
#: Committed txns whose ``.json`` objects go in one DeleteObjects (one request, not one per commit).
CLEANUP_BATCH = 8
#: ... or fewer, once the oldest of them waited this long (a connector that commits rarely).
CLEANUP_AGE_S = 30.0
T = TypeVar("T")


@dataclass(slots=True)
class CycleTimings:
    """Milliseconds of the last cycle's phases (for metrics and the benchmark)."""

    group_ms: float = 0.0  # the batch's records per partition (in write)
    encode_ms: float = 0.0  # JSON Lines of the slices (in write)
    body_ms: float = 0.0  # the objects' bodies (in prepare: JSON Lines joined, or Parquet encoded)
    prepare_ms: float = 0.0  # creates, bodies, parts, epoch reads, the txn's .json
    creates_ms: float = 0.0  # from the prepare's start until its last create answered (no part goes before)
    commit_ms: float = 0.0  # completes, epoch raises


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
    def from_json(cls, data: bytes) -> Prepared:
        d = json.loads(data)
        staged = tuple(Staged(k, u, tuple((int(n), str(e)) for n, e in ps)) for k, u, ps in d["uploads"])
        return cls(TxnManifest.from_json(json.dumps(d["manifest"])), str(d["ext"]), staged)


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

    @property
    def epochs_dir(self) -> str:
        return self.key("__epochs__", self.connector) + "/"

    def epoch_key(self, tp: TopicPartition) -> str:
        return f"{self.epochs_dir}{tp.topic}-{tp.partition}"


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
        # Lower bounds of the stored epochs (they only grow): commit skips raising what is high enough.
        self._epochs: dict[TopicPartition, int] = {}
        # (epoch, ETag or None when absent) of epoch objects as the last fence saw them: the first
        # compare-and-set of a raise starts from it instead of reading the object again.
        self._fenced: dict[TopicPartition, tuple[int, str | None]] = {}
        # .json keys of committed txns not deleted yet (see _tidy), oldest first, and when the first came.
        self._committed: dict[str, None] = {}
        self._committed_since = 0.0
        self._cleanups: list[tuple[Future[None], list[str]]] = []  # background deletes and their keys
        self.timings = CycleTimings()

    def close(self) -> None:
        self._tidy(force=True)
        self._small.shutdown(wait=True)  # background cleanups included
        self._reap_cleanups()
        self._data.shutdown(wait=True)

    # -- prepare ----------------------------------------------------------------------------
    def prepare(self, manifest: TxnManifest, bodies: Sequence[bytes] | Callable[[], Sequence[bytes]], ext: str) -> None:
        """The objects of ``manifest.ranges`` (in that order): creates first (they need no body),
        then every part; the fence's LIST and the txn's ``.json`` (once the creates answered) run
        alongside. ``bodies`` is either made already (JSON Lines: encoded by ``write``, joined in ~2 ms
        per 12 MB, which beside the creates' threads would wait several ms for the GIL and hold back
        every part) or made by calling it while the creates run (Parquet: encoding takes longer
        than a create's round trip)."""
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
        fence = self._small.submit(self._fence, manifest)
        record = self._small.submit(self._put_record, manifest, ext, keys, creates)
        parts: list[list[Future[tuple[int, str]]]] = []
        try:
            try:
                # Every body before the first part goes out: encoding is CPU under the GIL, and run
                # beside uploads it waits for their threads (2-3x longer; measured), delaying the
                # last object's upload by more than encoding them all first does.
                made = bodies() if callable(bodies) else bodies
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

    def _fence(self, manifest: TxnManifest) -> None:
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
        try:
            return int(got[0]), got[1]["ETag"]
        except ValueError:
            raise FatalError(f"s3://{self.bucket.name}/{key} holds {got[0][:40]!r}, not an epoch number",
                             component=COMPONENT) from None

    # -- commit -----------------------------------------------------------------------------
    def commit(self, txn_id: str) -> None:
        t0 = time.perf_counter()
        prepared = self._prepared.get(txn_id) or self._load(txn_id)
        if prepared is None:
            return  # committed and cleaned up, aborted, or never prepared here: nothing to do
        self._complete_all(prepared)
        self._prepared.pop(txn_id, None)
        if not self._committed:
            self._committed_since = time.monotonic()
        self._committed[self.layout.pending_key(txn_id)] = None
        self._tidy()
        self.timings.commit_ms = (time.perf_counter() - t0) * 1000

    def _tidy(self, force: bool = False) -> None:
        """Delete the ``.json`` of committed txns, several in one background DeleteObjects.

        The ``.json`` of a committed txn only tidies up, so it need not go at once: every
        :data:`CLEANUP_BATCH` commits (or :data:`CLEANUP_AGE_S`, or at close and recover) one
        request deletes them all instead of one request per commit. Until then, or after a crash,
        ``recover`` finds them complete and finishes them like any committed txn it finds.
        """
        self._reap_cleanups()
        due = len(self._committed) >= CLEANUP_BATCH or time.monotonic() - self._committed_since >= CLEANUP_AGE_S
        if self._committed and (force or due):
            keys = list(self._committed)
            self._cleanups.append((self._small.submit(self.bucket.delete, keys), keys))
            self._committed = {}

    def _complete_all(self, prepared: Prepared) -> None:
        txn = prepared.manifest.txn_id
        epochs = [self._small.submit(self._raise_epoch, r.tp, r.epoch) for r in prepared.manifest.ranges]
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
                "remove that rule (README: runbook, 'prepared S3 uploads vanished')", component=COMPONENT)
        _settle(epochs)

    def _complete(self, txn_id: str, s: Staged) -> Staged | None:
        """Complete one upload; None when the object is (now or already) this txn's, ``s`` when lost."""
        listed = s.parts or self._list_parts(s)
        if listed is None:  # the upload is gone
            return None if self._written_by(txn_id, s.key) else s
        parts = {"Parts": [{"PartNumber": n, "ETag": etag} for n, etag in listed]}
        if self.bucket.call("complete_multipart_upload", s.key, Key=s.key, UploadId=s.upload_id, MultipartUpload=parts,
                            none_on=MISSING) is not None:
            return None
        return None if self._written_by(txn_id, s.key) else s

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

    def _raise_epoch(self, tp: TopicPartition, epoch: int) -> None:
        """Compare-and-set the epoch object to ``max(stored, epoch)``; never lowers it."""
        if self._epochs.get(tp, -1) >= epoch:
            return
        key = self.layout.epoch_key(tp)
        fenced = self._fenced.pop(tp, None)  # what this prepare's fence saw: a stale one only loses the CAS
        for _ in range(20):
            seen, etag = fenced or self._stored_epoch(tp)
            fenced = None
            if seen >= epoch:
                break
            cond = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
            if self.bucket.call("put_object", key, Key=key, Body=str(epoch).encode(), none_on=CONFLICT, **cond) is not None:
                break  # None: another writer changed it since we read it; read again
        else:
            raise RetryableError(f"epoch of {tp} at s3://{self.bucket.name}/{key} keeps changing under us",
                                 component=COMPONENT)
        self._epochs[tp] = max(self._epochs.get(tp, -1), epoch)

    def _reap_cleanups(self, block: bool = False) -> None:
        """Forget finished background cleanups (waiting for all with ``block``); a failed one is
        logged and its keys go with the next one: its txns are committed, and ``recover``
        finishes the cleanup of any an instance did not."""
        if block:
            wait([f for f, _ in self._cleanups])
        still: list[tuple[Future[None], list[str]]] = []
        for f, keys in self._cleanups:
            if not f.done():
                still.append((f, keys))
            elif f.exception() is not None:
                structlog.get_logger("eosink.s3").warning(
                    "cleanup_failed", connector=self.layout.connector, bucket=self.bucket.name, error=str(f.exception()),
                    note="the txns are committed; the next cleanup or recover deletes their .json")
                if not self._committed:
                    self._committed_since = time.monotonic()
                self._committed.update(dict.fromkeys(keys))
        self._cleanups = still

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
        self._tidy(force=True)
        self._reap_cleanups(block=True)  # not to race this instance's own background deletes
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
            return Prepared.from_json(got[0])
        except (ValueError, KeyError, TypeError) as exc:
            raise FatalError(f"s3://{self.bucket.name}/{key} is not a prepared txn: {exc!r}", component=COMPONENT) from None

    def _parallel(self, fn: Callable[[Any], T], items: Iterable[Any]) -> list[T]:
        return _settle([self._small.submit(fn, x) for x in items])


def _settle(futures: list[Future[T]]) -> list[T]:
    """Wait for every future, then raise the first failure: never leave a request in flight."""
    wait(futures)
    return [f.result() for f in futures]
