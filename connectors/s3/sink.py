"""S3 sink: one object per partition per transaction, prepared under ``__pending__`` then copied.

Layout in ``s3.bucket.name`` under ``s3.prefix`` (``P``; keys start at the bucket root when empty)::

    P/__pending__/<connector>/<txn>/<topic>/<partition>.<ext>       prepared data, invisible
    P/__pending__/<connector>/<txn>/_manifest.json                  the TxnManifest, written LAST
    P/__commits__/<connector>/<txn>                                  commit marker (the manifest again)
    P/__epochs__/<connector>/<topic>-<partition>                     highest epoch committed there
    P/<connector>/<topic>/<partition>/<first:020d>-<last:020d>.<ext> visible data

**Why the manifest last.** S3 has no transactions: a prepare that dies halfway leaves some
objects behind. A txn is *prepared* exactly when its ``_manifest.json`` exists, so
:meth:`S3Sink.recover` never lists a half-written batch (and the engine never decided one: it
decides only after ``pre_commit`` returned). Halves without a manifest are deleted by
``recover`` once they are :data:`ORPHAN_AGE_S` old (younger ones may be a live prepare of
another task of the same connector).

**Why copy to a deterministic key.** The final key is derived from the offsets alone, so a
commit replayed after a crash - or a batch re-delivered by a new owner - overwrites the same
object with the same bytes instead of adding a duplicate. ``copy_object`` keeps the pending
object's user metadata, which carries ``eosink-epoch`` and ``eosink-txn``.

**Why a commit marker.** ``commit`` is one round of requests in parallel: copy every object,
raise the epoch objects, put ``__commits__/<txn>`` with ``IfNoneMatch="*"``. Once the marker
exists the txn is committed whatever happens next: a second ``commit`` (412 on the marker) and
``recover`` copy whatever is still pending - copies are idempotent, to deterministic keys - and
clean up. The cleanup (delete the pending prefix, data first, manifest last, in one request)
runs in the background once ``commit`` has returned: it only tidies a committed txn, and a
crash before it ends is finished by ``recover`` like any other. Markers are tiny and kept as an
audit trail; expire ``__commits__/`` with a bucket lifecycle rule if they pile up.

**Visibility.** Each object appears atomically and complete; the objects of one txn appear one
after the other within the commit (S3 cannot publish several keys at once). Readers list
``P/<connector>/`` and never ``__*`` prefixes.

**The resource fence.** ``prepare`` lists ``__epochs__/...`` (while the objects upload: they are
invisible) and, when the manifest's epoch is older than one stored for its partitions, deletes
what it uploaded and raises :class:`~eosink.connectors.api.errors.FencedError` before the manifest exists.
``commit`` raises the stored epoch with a compare-and-set (``IfMatch`` on the ETag) so two
writers never lower it.

**Formats.** ``jsonl``: the record's JSON bytes as they were on the topic, one per line (values
containing a line break are re-encoded compactly; non-JSON string values are JSON-quoted).
``parquet``: one Parquet file per object, schema inferred by pyarrow over the whole batch (the
union of the objects' fields), plus ``__topic``, ``__partition`` and ``__offset`` columns.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import operator
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote, unquote

import boto3
import structlog
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError, IncompleteReadError, NoCredentialsError
from botocore.exceptions import ConnectionError as BotoConnectionError

from eosink.connectors.api.config import ConfigDef, Importance, Type, at_least, non_empty, one_of
from eosink.connectors.api.errors import EosinkError, FatalError, FencedError, RecordError, RetryableError
from eosink.connectors.api.records import PartitionRange, SinkRecord, TopicPartition, TxnManifest, json_document
from eosink.connectors.api.sink import BatchingSink

COMPONENT = "s3"
MIB = 1024 * 1024
MANIFEST = "_manifest.json"
#: Threads for the small requests (fence listing, commit marker, epoch raises, cleanup).
BOOKKEEPING_THREADS = 2
#: copy_object's limit; a partition's batch is bounded far below it by ``batch.max.bytes``.
MAX_OBJECT_BYTES = 5 * 1024 * MIB
#: Age after which a pending prefix without a manifest is garbage, not a prepare in flight.
ORPHAN_AGE_S = 3600.0
KAFKA_COLUMNS = ("__topic", "__partition", "__offset")
CONTENT_TYPES = {"jsonl": "application/x-ndjson", "parquet": "application/vnd.apache.parquet"}
_RETRYABLE_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestLimitExceeded",
                              "InternalError", "ServiceUnavailable", "OperationAborted", "TooManyRequests"})
_DENIED_CODES = frozenset({"AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"})
#: "Not there" answers (HEAD has no body, so its code is the bare status; NoSuchBucket is not one).
MISSING = frozenset({"NoSuchKey", "NoSuchUpload", "404"})
#: A conditional write lost: the object exists (IfNoneMatch) or changed (IfMatch).
CONFLICT = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict", "409"})
T = TypeVar("T")


@dataclass(slots=True)
class CycleTimings:
    """Milliseconds of the last cycle's phases (for metrics and the benchmark)."""

    encode_ms: float = 0.0
    prepare_ms: float = 0.0  # epoch reads, uploads, manifest
    commit_ms: float = 0.0  # copies, epoch raise, marker, cleanup


def json_line(r: SinkRecord) -> bytes:
    return json_document(r, component=COMPONENT, needs="JSON output needs json or string values")


_raw_value = operator.attrgetter("raw_value")
_value = operator.attrgetter("value")
_CONTAINERS = (dict, list)


def encode_jsonl(records: list[SinkRecord]) -> bytes:
    # The usual batch - JSON objects or arrays, each with its bytes from the topic - is checked and
    # gathered by C loops (map/all), not a Python step per record: this is most of the sink's CPU time.
    lines = list(map(_raw_value, records))
    if None in lines or not all(map(isinstance, map(_value, records), itertools.repeat(_CONTAINERS))):
        lines = [json_line(r) for r in records]
    lines.append(b"")  # the last line's newline, without copying the whole object once more
    data = b"\n".join(lines)
    if data.count(b"\n") != len(lines) - 1:  # pretty-printed JSON on the topic: keep one record per line
        lines = [json.dumps(json.loads(x), separators=(",", ":")).encode() if b"\n" in x else x for x in lines[:-1]]
        lines.append(b"")
        data = b"\n".join(lines)
    return data


def encode_parquet(records: list[SinkRecord]) -> bytes:
    import pyarrow as pa  # only connectors with format=parquet pay for the import
    import pyarrow.parquet as pq

    first = records[0]
    for r in records:
        if not isinstance(r.value, dict):
            raise RecordError("format=parquet needs JSON object values (one column per field)",
                              topic=r.topic, partition=r.partition, offset=r.offset, component=COMPONENT)
    try:
        table = pa.Table.from_struct_array(pa.array([r.value for r in records]))  # infers over every record
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise RecordError(f"no single Parquet schema fits the batch (offsets {first.offset}..{records[-1].offset}): {exc}",
                          topic=first.topic, partition=first.partition, offset=first.offset, component=COMPONENT) from None
    for name in KAFKA_COLUMNS:
        if name in table.column_names:
            raise RecordError("field collides with the Kafka coordinate column", topic=first.topic,
                              partition=first.partition, offset=first.offset, column=name, component=COMPONENT)
    n = len(records)
    table = (table.append_column("__topic", pa.array([first.topic] * n, pa.string()))
             .append_column("__partition", pa.array([first.partition] * n, pa.int32()))
             .append_column("__offset", pa.array([r.offset for r in records], pa.int64())))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="snappy")
    return sink.getvalue().to_pybytes()


ENCODERS: dict[str, Callable[[list[SinkRecord]], bytes]] = {"jsonl": encode_jsonl, "parquet": encode_parquet}


class S3Sink(BatchingSink):
    """Exactly-once delivery into S3 objects (AWS, MinIO, moto) by prepare-copy-mark."""

    ALIAS = "s3"
    CONFIG = (
        ConfigDef()
        .define("s3.bucket.name", Type.STRING, doc="Bucket to write to.", importance=Importance.HIGH, validator=non_empty)
        .define("s3.prefix", Type.STRING, "", "Key prefix for data and bookkeeping (no leading or trailing '/').")
        .define("s3.endpoint.url", Type.STRING, None, "S3 endpoint, e.g. http://minio:9000; unset for AWS.")
        .define("s3.region", Type.STRING, "us-east-1", "Region of the bucket (and of a bucket this connector creates).")
        .define("s3.path.style.access", Type.BOOLEAN, False, "Path-style URLs (MinIO and other endpoints without bucket DNS).")
        .define("aws.access.key.id", Type.STRING, None, "Access key id; unset uses the default AWS credential chain.", Importance.HIGH)
        .define("aws.secret.access.key", Type.PASSWORD, None, "Secret access key for aws.access.key.id.", Importance.HIGH)
        .define("aws.session.token", Type.PASSWORD, None, "Session token for temporary credentials.")
        .define("format", Type.STRING, "jsonl", "jsonl: the value bytes, one record per line. parquet: columns inferred "
                "from the JSON objects, plus __topic, __partition, __offset.", Importance.HIGH, one_of("jsonl", "parquet"))
        .define("s3.part.size", Type.LONG, 8 * MIB, "Objects larger than this are uploaded in parts of this size "
                "(multipart upload; S3's minimum part is 5 MiB).", validator=at_least(5 * MIB))
        .define("s3.bucket.create", Type.BOOLEAN, True, "Create the bucket at start when it is missing.")
        .define("s3.max.attempts", Type.INT, 5, "Attempts per request (botocore retries throttling, 5xx and connection "
                "errors with backoff); then the cycle fails as retryable.", validator=at_least(1))
        .define("s3.max.concurrency", Type.INT, 4, "Data requests (uploads, copies) in flight at once within a cycle, "
                "one object per partition; two more threads carry the small bookkeeping requests.",
                validator=at_least(1))
    )

    def __init__(self, connector: str, config: Mapping[str, Any]) -> None:
        super().__init__(connector, config)
        c = self.config
        self.bucket: str = c["s3.bucket.name"]
        self.prefix: str = c["s3.prefix"].strip("/")
        self.format: str = c["format"]
        self.part_size: int = int(c["s3.part.size"])
        self._client: Any = None
        self._pool: ThreadPoolExecutor | None = None  # data: uploads and copies
        self._small: ThreadPoolExecutor | None = None  # bookkeeping: fence, marker, epochs, cleanup
        # Prepared by this instance: commit skips reading the manifest back.
        self._prepared: dict[str, tuple[TxnManifest, str]] = {}
        # Lower bounds of the stored epochs (they only grow): commit skips raising what is high enough.
        self._epochs: dict[TopicPartition, int] = {}
        # Background deletes of committed txns' pending prefixes (see commit).
        self._cleanups: list[Future[None]] = []
        self.timings = CycleTimings()

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        """Build the client and check the bucket (creating it if allowed): bad credentials fail here."""
        c = self.config
        conc = int(c["s3.max.concurrency"])
        boto_config = Config(
            retries={"max_attempts": int(c["s3.max.attempts"]), "mode": "standard"},
            connect_timeout=10, read_timeout=60, max_pool_connections=max(10, conc + BOOKKEEPING_THREADS),
            s3={"addressing_style": "path" if c["s3.path.style.access"] else "auto"},
        )
        if self._client is not None:  # opened again (a restarted task): start from a fresh client
            self._client.close()
        self._client = boto3.session.Session().client(
            "s3", endpoint_url=c["s3.endpoint.url"] or None, region_name=c["s3.region"],
            aws_access_key_id=c["aws.access.key.id"] or None, aws_secret_access_key=c["aws.secret.access.key"] or None,
            aws_session_token=c["aws.session.token"] or None, config=boto_config,
        )
        self._pool = self._pool or ThreadPoolExecutor(conc, thread_name_prefix=f"s3-{self.connector}")
        # Small requests get threads of their own, so they never queue behind megabytes of data.
        self._small = self._small or ThreadPoolExecutor(BOOKKEEPING_THREADS, thread_name_prefix=f"s3-{self.connector}-small")
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if _status(exc) != 404:
                raise self._error(exc, "head_bucket", None) from exc
            if not c["s3.bucket.create"]:
                raise FatalError(f"bucket s3://{self.bucket} does not exist and s3.bucket.create=false", component=COMPONENT) from exc
            region = c["s3.region"]
            kwargs = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
            try:
                self._client.create_bucket(Bucket=self.bucket, **kwargs)
            except ClientError as exc2:
                if _code(exc2) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise self._error(exc2, "create_bucket", None) from exc2
        except BotoCoreError as exc:
            raise self._error(exc, "head_bucket", None) from exc

    def close(self) -> None:
        if self._small is not None:
            self._small.shutdown(wait=True)  # background cleanups included
            self._small = None
            self._reap_cleanups()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- keys -------------------------------------------------------------------------------
    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def _pending_dir(self, txn_id: str) -> str:
        return self._key("__pending__", self.connector, quote(txn_id, safe="")) + "/"

    def _pending_key(self, txn_id: str, r: PartitionRange, ext: str) -> str:
        return f"{self._pending_dir(txn_id)}{r.topic}/{r.partition}.{ext}"

    def final_key(self, r: PartitionRange, ext: str | None = None) -> str:
        name = f"{r.first_offset:020d}-{r.last_offset:020d}.{ext or self.format}"
        return self._key(self.connector, r.topic, str(r.partition), name)

    def _marker_key(self, txn_id: str) -> str:
        return self._key("__commits__", self.connector, quote(txn_id, safe=""))

    def _epoch_key(self, tp: TopicPartition) -> str:
        return self._key("__epochs__", self.connector, f"{tp.topic}-{tp.partition}")

    # -- prepare ----------------------------------------------------------------------------
    def prepare_batch(self, manifest: TxnManifest, records: list[SinkRecord]) -> None:
        """Fence reads and uploads run together (each object uploads as soon as it is encoded);
        the manifest goes up only after the fence passed and every object is in."""
        t0 = time.perf_counter()
        txn, ext = manifest.txn_id, self.format
        groups: dict[tuple[str, int], list[SinkRecord]] = {r.tp: [] for r in manifest.ranges}
        for rec in records:
            group = groups.get((rec.topic, rec.partition))  # TopicPartition hashes and compares as this tuple
            if group is None:
                raise FatalError(f"txn {txn}: record {rec.tp}@{rec.offset} is outside the manifest's partitions", component=COMPONENT)
            group.append(rec)
        encode = ENCODERS[self.format]
        meta_base = {"eosink-txn": quote(txn, safe=""), "eosink-connector": self.connector}
        # Not waited for before uploading: pending objects are invisible, so a fenced prepare only
        # has to delete them again, and an unfenced one (every one but a zombie's) saves a round trip.
        fence = [self._submit_small(self._fence, manifest)]
        uploads: list[Future[None]] = []
        encode_s = 0.0
        try:
            for r in manifest.ranges:
                e0 = time.perf_counter()
                body = encode(groups[r.tp]) if groups[r.tp] else b""
                encode_s += time.perf_counter() - e0
                if len(body) > MAX_OBJECT_BYTES:
                    raise FatalError(f"txn {txn}: {len(body)} bytes for {r.tp} exceed {MAX_OBJECT_BYTES} (S3's copy "
                                     "limit); lower batch.max.bytes", component=COMPONENT)
                uploads.append(self._submit(self._upload, self._pending_key(txn, r, ext), body,
                                            {**meta_base, "eosink-epoch": str(r.epoch)}))
        finally:
            wait([*fence, *uploads])  # nothing left in flight when this returns or raises
        try:
            _settle(fence)
        except FencedError:
            try:
                self._discard_pending(txn)  # a zombie leaves nothing behind
            except EosinkError:
                pass  # the engine aborts the txn next, which deletes the prefix again
            raise
        _settle(uploads)
        # Last: from here on the txn is prepared (recover lists it).
        mkey = self._pending_dir(txn) + MANIFEST
        self._call("put_object", mkey, Key=mkey, Body=manifest.to_json().encode(),
                   ContentType="application/json", Metadata={"eosink-ext": ext})
        self._prepared[txn] = (manifest, ext)
        self.timings = CycleTimings(encode_ms=encode_s * 1000, prepare_ms=(time.perf_counter() - t0) * 1000)

    def _fence(self, manifest: TxnManifest) -> None:
        """Refuse a prepare whose epoch is older than one already committed on any of its partitions.

        One LIST of the connector's epoch objects instead of a GET per partition: a plain PUT's
        ETag is the MD5 of its bytes, so an epoch object whose ETag is the MD5 of the epoch this
        instance last saw there has not changed. Only the others are read (all of them where ETags
        are not MD5s, e.g. under SSE-KMS: correct, just one GET each).
        """
        wanted = {self._epoch_key(r.tp): r for r in manifest.ranges}
        etags = {o["Key"]: o.get("ETag", "").strip('"') for o in self._list(self._key("__epochs__", self.connector) + "/")
                 if o["Key"] in wanted}
        for key, r in wanted.items():
            etag = etags.get(key)
            known = self._epochs.get(r.tp)
            if etag is None:
                seen = -1
            elif known is not None and etag == hashlib.md5(str(known).encode(), usedforsecurity=False).hexdigest():
                seen = known
            else:
                seen, _ = self._stored_epoch(r.tp)
            self._epochs[r.tp] = max(self._epochs.get(r.tp, -1), seen)
            if r.epoch < seen:
                raise FencedError(f"epoch {r.epoch} for {r.tp} is older than {seen} already committed "
                                  f"(s3://{self.bucket}/{key})", component=COMPONENT)

    def _stored_epoch(self, tp: TopicPartition) -> tuple[int, str | None]:
        """(epoch, ETag) of the partition's epoch object; (-1, None) when there is none yet."""
        key = self._epoch_key(tp)
        got = self._get(key)
        if got is None:
            return -1, None
        try:
            return int(got[0]), got[1]["ETag"]
        except ValueError:
            raise FatalError(f"s3://{self.bucket}/{key} holds {got[0][:40]!r}, not an epoch number", component=COMPONENT) from None

    def _upload(self, key: str, body: bytes, metadata: dict[str, str]) -> None:
        ctype = CONTENT_TYPES[self.format]
        if len(body) <= self.part_size:
            self._call("put_object", key, Key=key, Body=body, Metadata=metadata, ContentType=ctype)
            return
        upload_id = self._call("create_multipart_upload", key, Key=key, Metadata=metadata, ContentType=ctype)["UploadId"]
        try:
            parts = []
            for n, off in enumerate(range(0, len(body), self.part_size), start=1):
                resp = self._call("upload_part", key, Key=key, UploadId=upload_id, PartNumber=n,
                                  Body=body[off:off + self.part_size])
                parts.append({"ETag": resp["ETag"], "PartNumber": n})
            self._call("complete_multipart_upload", key, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts})
        except BaseException:
            try:
                self._call("abort_multipart_upload", key, Key=key, UploadId=upload_id, none_on=MISSING)
            except EosinkError:
                pass  # abort() of the txn lists and aborts leftover uploads under its prefix
            raise

    # -- commit / abort / recover -----------------------------------------------------------
    def commit(self, txn_id: str) -> None:
        t0 = time.perf_counter()
        entry = self._prepared.get(txn_id) or self._load_manifest(txn_id)
        if entry is None:
            return  # committed and cleaned up, aborted, or never prepared here: nothing to do
        manifest, ext = entry
        marker = self._marker_key(txn_id)
        # The small requests first, so they do not queue behind the copies for a free connection.
        # None (412) = the marker exists: committed before, at most the copies and cleanup were left.
        mark = self._submit_small(lambda: self._call("put_object", marker, Key=marker, Body=manifest.to_json().encode(),
                                               ContentType="application/json", IfNoneMatch="*", none_on=CONFLICT))
        epochs = [self._submit_small(self._raise_epoch, r.tp, r.epoch) for r in manifest.ranges]
        copies = [self._submit(self._copy, txn_id, r, ext) for r in manifest.ranges]
        wait([*copies, *epochs, mark])
        created = mark.exception() is None and mark.result() is not None
        # A failure below leaves the txn to a retried commit or to recover: copies are idempotent,
        # and a marker, once there, says committed.
        missing = [k for k in _settle(copies) if k]
        if missing and created:  # gone without an earlier commit: lost, so this txn must not look committed
            self._call("delete_objects", marker, Delete={"Objects": [{"Key": marker}], "Quiet": True})
            raise FatalError(f"commit {txn_id}: prepared object s3://{self.bucket}/{missing[0]} is missing and no "
                             "commit marker exists: the prepared batch is lost", component=COMPONENT)
        _settle(epochs)
        _settle([mark])
        self._prepared.pop(txn_id, None)
        self._reap_cleanups()
        self._cleanups.append(self._submit_small(self._cleanup, txn_id, manifest, ext))
        self.timings.commit_ms = (time.perf_counter() - t0) * 1000

    def _copy(self, txn_id: str, r: PartitionRange, ext: str) -> str | None:
        """Copy one pending object to its final key; its pending key when it is not there any more."""
        src, dst = self._pending_key(txn_id, r, ext), self.final_key(r, ext)
        done = self._call("copy_object", dst, Key=dst, CopySource={"Bucket": self.bucket, "Key": src}, none_on=MISSING)
        return None if done is not None else src

    def _finish(self, txn_id: str, manifest: TxnManifest, ext: str) -> None:
        """Complete a txn whose marker exists: copy what is still pending, then clean up."""
        self._parallel(lambda r: self._copy(txn_id, r, ext), manifest.ranges)
        self._cleanup(txn_id, manifest, ext)

    def _reap_cleanups(self, block: bool = False) -> None:
        """Forget finished background cleanups (waiting for all with ``block``); a failed one is
        logged: its txn is committed, and ``recover`` finishes the cleanup."""
        if block:
            wait(self._cleanups)
        still: list[Future[None]] = []
        for f in self._cleanups:
            if not f.done():
                still.append(f)
            elif f.exception() is not None:
                structlog.get_logger("eosink.s3").warning(
                    "cleanup_failed", connector=self.connector, bucket=self.bucket, error=str(f.exception()),
                    note="the txn is committed; recover deletes its pending prefix")
        self._cleanups = still

    def _raise_epoch(self, tp: TopicPartition, epoch: int) -> None:
        """Compare-and-set the epoch object to ``max(stored, epoch)``; never lowers it."""
        if self._epochs.get(tp, -1) >= epoch:
            return
        key = self._epoch_key(tp)
        for _ in range(20):
            seen, etag = self._stored_epoch(tp)
            if seen >= epoch:
                break
            cond = {"IfMatch": etag} if etag else {"IfNoneMatch": "*"}
            if self._call("put_object", key, Key=key, Body=str(epoch).encode(), none_on=CONFLICT, **cond) is not None:
                break  # None: another writer changed it since we read it; read again
        else:
            raise RetryableError(f"epoch of {tp} at s3://{self.bucket}/{key} keeps changing under us", component=COMPONENT)
        self._epochs[tp] = max(self._epochs.get(tp, -1), epoch)

    def _cleanup(self, txn_id: str, manifest: TxnManifest, ext: str) -> None:
        """Delete the pending prefix of a committed txn in one request. Its marker exists, so a
        crash in between is finished by ``recover``; a data object left without its manifest is
        collected as an orphan."""
        self._delete([self._pending_key(txn_id, r, ext) for r in manifest.ranges] + [self._pending_dir(txn_id) + MANIFEST])

    def abort(self, txn_id: str) -> None:
        if self._txn_id == txn_id:
            self._batch = []
        self._prepared.pop(txn_id, None)
        self._discard_pending(txn_id)

    def _discard_pending(self, txn_id: str) -> None:
        """Delete everything under the txn's pending prefix: unfinished multipart uploads, data
        objects, and the manifest last (so a crash halfway leaves a prepared txn or an orphan)."""
        prefix = self._pending_dir(txn_id)
        uploads = self._call("list_multipart_uploads", prefix, Prefix=prefix).get("Uploads", [])
        for u in uploads:
            self._call("abort_multipart_upload", u["Key"], Key=u["Key"], UploadId=u["UploadId"], none_on=MISSING)
        keys = [o["Key"] for o in self._list(prefix)]
        self._delete([k for k in keys if not k.endswith("/" + MANIFEST)])
        self._delete([k for k in keys if k.endswith("/" + MANIFEST)])

    def recover(self) -> list[TxnManifest]:
        self._reap_cleanups(block=True)  # not to race this instance's own background deletes
        out: list[TxnManifest] = []
        root = self._key("__pending__", self.connector) + "/"
        txn_dirs = [p["Prefix"] for page in self._pages(root, Delimiter="/") for p in page.get("CommonPrefixes", [])]
        for d in txn_dirs:
            txn_id = unquote(d[len(root):-1])
            entry = self._load_manifest(txn_id)
            if entry is None:
                self._collect_orphan(d)
            elif self._marker_exists(txn_id):
                self._finish(txn_id, *entry)  # committed: copies and cleanup may be left
            else:
                out.append(entry[0])
        return out

    def _collect_orphan(self, prefix: str) -> None:
        """A prepare that died before its manifest: delete it once it is surely not in flight."""
        objs = list(self._list(prefix))
        if objs and all(time.time() - o["LastModified"].timestamp() > ORPHAN_AGE_S for o in objs):
            self._delete([o["Key"] for o in objs])

    def _load_manifest(self, txn_id: str) -> tuple[TxnManifest, str] | None:
        key = self._pending_dir(txn_id) + MANIFEST
        got = self._get(key)
        if got is None:
            return None
        try:
            manifest = TxnManifest.from_json(got[0])
        except (ValueError, KeyError, TypeError) as exc:
            raise FatalError(f"s3://{self.bucket}/{key} is not a txn manifest: {exc!r}", component=COMPONENT) from None
        return manifest, got[1].get("Metadata", {}).get("eosink-ext", self.format)

    def _marker_exists(self, txn_id: str) -> bool:
        key = self._marker_key(txn_id)
        return self._call("head_object", key, Key=key, none_on=MISSING) is not None

    # -- plumbing ---------------------------------------------------------------------------
    def _list(self, prefix: str) -> Iterable[dict[str, Any]]:
        for page in self._pages(prefix):
            yield from page.get("Contents", [])

    def _get(self, key: str) -> tuple[bytes, dict[str, Any]] | None:
        """The object's bytes and response, or None when it does not exist."""
        resp = self._call("get_object", key, Key=key, none_on=MISSING)
        if resp is None:
            return None
        try:
            return resp["Body"].read(), resp
        except BotoCoreError as exc:  # the connection broke while streaming the body
            raise self._error(exc, "get_object", key) from exc

    def _pages(self, prefix: str, **kwargs: Any) -> Iterable[dict[str, Any]]:
        try:
            yield from self._open_client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix, **kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, "list_objects_v2", prefix) from exc

    def _delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000 keys
            chunk = keys[i:i + 1000]
            resp = self._call("delete_objects", chunk[0], Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True})
            if resp.get("Errors"):
                e = resp["Errors"][0]
                raise RetryableError(f"delete s3://{self.bucket}/{e.get('Key')} failed: {e.get('Code')} {e.get('Message')}",
                                     component=COMPONENT)

    def _submit_small(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        return self._submit(fn, *args, pool=self._small)

    def _submit(self, fn: Callable[..., T], *args: Any, pool: ThreadPoolExecutor | None = None) -> Future[T]:
        pool = pool or self._pool
        if pool is not None:
            return pool.submit(fn, *args)
        done: Future[T] = Future()
        try:
            done.set_result(fn(*args))
        except Exception as exc:  # noqa: BLE001 - delivered by _settle, like a pool's future
            done.set_exception(exc)
        return done

    def _parallel(self, fn: Callable[[Any], T], items: Iterable[Any]) -> list[T]:
        return _settle([self._submit(fn, x) for x in items])

    def _open_client(self) -> Any:
        if self._client is None:
            raise FatalError("the sink is not open (call open() first)", component=COMPONENT)
        return self._client

    def _call(self, op: str, key: str | None, *, none_on: frozenset[str] = frozenset(), **kwargs: Any) -> Any:
        """``client.<op>(Bucket=..., **kwargs)`` with botocore's failures turned into outcome classes.

        ``key`` only names the object in error messages. A ClientError whose code is in ``none_on``
        returns None: the expected "not there" (404) or "precondition failed" (412) answers.
        """
        try:
            return getattr(self._open_client(), op)(Bucket=self.bucket, **kwargs)
        except ClientError as exc:
            if _code(exc) in none_on:
                return None
            raise self._error(exc, op, key) from exc
        except BotoCoreError as exc:
            raise self._error(exc, op, key) from exc

    def _error(self, exc: Exception, op: str, key: str | None) -> EosinkError:
        where = f"s3://{self.bucket}/{key}" if key else f"s3://{self.bucket}"
        if isinstance(exc, ClientError):
            code, status = _code(exc), _status(exc)
            msg = exc.response.get("Error", {}).get("Message", "")
            if status >= 500 or code in _RETRYABLE_CODES:
                return RetryableError(f"{op} {where}: {code} (HTTP {status}) {msg}", component=COMPONENT)
            if code in _DENIED_CODES:
                return FatalError(f"{op} {where}: access denied ({code}): check aws.access.key.id / "
                                  f"aws.secret.access.key and the policy of bucket {self.bucket}", component=COMPONENT)
            if code == "NoSuchBucket":
                return FatalError(f"{op} {where}: bucket {self.bucket} does not exist", component=COMPONENT)
            return FatalError(f"{op} {where}: {code} (HTTP {status}) {msg}", component=COMPONENT)
        if isinstance(exc, (BotoConnectionError, HTTPClientError, IncompleteReadError)):
            endpoint = self.config["s3.endpoint.url"] or "AWS S3"
            return RetryableError(f"{op} {where}: cannot reach {endpoint}: {exc}", component=COMPONENT)
        if isinstance(exc, NoCredentialsError):
            return FatalError(f"{op} {where}: no AWS credentials: set aws.access.key.id and aws.secret.access.key",
                              component=COMPONENT)
        return FatalError(f"{op} {where}: {type(exc).__name__}: {exc}", component=COMPONENT)


def _settle(futures: list[Future[T]]) -> list[T]:
    """Wait for every future, then raise the first failure: never leave a request in flight."""
    wait(futures)
    return [f.result() for f in futures]


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
