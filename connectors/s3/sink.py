"""The S3 sink: one object per partition per txn, staged as a multipart upload, completed at commit.

The two phases are S3's own (CreateMultipartUpload + UploadPart at prepare, CompleteMultipartUpload
at commit): :mod:`.protocol` says how and why (its keys and ``.json`` in :mod:`.layout`, its epoch
fence in :mod:`.fence`, its deletes of committed ``.json`` in :mod:`.cleanup`), :mod:`.encoding`
what the objects hold, :mod:`.staging` how ``write`` groups the slices of a batch as they arrive
(the prepare encodes them), :mod:`.client` how failures become outcome classes. This module is the connector: its
configuration, its lifecycle, and the objects of a txn (one per partition of its manifest).

**Visibility.** Each object appears atomically and complete; the objects of one txn appear one
after the other within the commit (S3 cannot publish several keys at once). Readers list
``P/<connector>/`` and never ``__*`` prefixes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from eosink.connectors.api.config import ConfigDef, Importance, Type, at_least, non_empty, one_of
from eosink.connectors.api.errors import ConfigError, FatalError
from eosink.connectors.api.records import PartitionRange, SinkRecord, TopicPartition, TxnManifest
from eosink.connectors.api.sink import TwoPhaseCommitSink
from eosink.connectors.common import heap
from eosink.connectors.s3.client import Bucket, code_of, make_client, status_of
from eosink.connectors.s3.encoding import ENCODERS
from eosink.connectors.s3.layout import Layout
from eosink.connectors.s3.protocol import BOOKKEEPING_THREADS, MIB, CycleTimings, MultipartTxns
from eosink.connectors.s3.staging import Staging

if TYPE_CHECKING:
    from eosink.connectors.s3.audit import S3Reader

COMPONENT = "s3"


class S3Sink(TwoPhaseCommitSink):
    """Exactly-once delivery into S3 objects (AWS, MinIO) by multipart uploads completed at commit."""

    CAUGHT_UP_COMMIT_MS = None  # an object per partition per transaction: cycles run their full commit.interval.ms

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
        .define("aws.ca.bundle", Type.STRING, None, "PEM file of the certificate authorities to trust for an https "
                "s3.endpoint.url signed by a private CA (MinIO or another S3 server with its own certificates): boto3's "
                "verify, the AWS CLI's ca_bundle. Unset: the AWS_CA_BUNDLE environment variable, else the system's "
                "trust store. Verification cannot be turned off.", Importance.MEDIUM)
        .define("format", Type.STRING, "jsonl", "jsonl: the value bytes, one record per line. parquet: columns typed from "
                "the writer's schema with an Avro, Protobuf or JSON Schema value.converter (as the Iceberg sink's; needs "
                "pyiceberg), else inferred from the JSON objects, plus __topic, __partition, __offset.", Importance.HIGH,
                one_of("jsonl", "parquet"))
        .define("s3.part.size", Type.LONG, 8 * MIB, "Size of the parts of each object's multipart upload (uploaded in "
                "parallel; S3's minimum part is 5 MiB, the last part may be smaller).", validator=at_least(5 * MIB))
        .define("s3.bucket.create", Type.BOOLEAN, True, "Create the bucket at start when it is missing.")
        .define("s3.max.attempts", Type.INT, 5, "Attempts per request (botocore retries throttling, 5xx and connection "
                "errors with backoff); then the cycle fails as retryable.", validator=at_least(1))
        .define("s3.max.concurrency", Type.INT, 4, "Data requests (creates, parts, completes) in flight at once within "
                "a cycle; two more threads carry the small bookkeeping requests.", validator=at_least(1))
    )

    def __init__(self, connector: str, config: Mapping[str, Any]) -> None:
        super().__init__(connector, config)
        c = self.config
        self.bucket_name: str = c["s3.bucket.name"]
        self.format: str = c["format"]
        self.reads_values = self.format != "jsonl"  # JSON Lines copies each value's bytes; Parquet reads the fields
        self.layout = Layout(c["s3.prefix"].strip("/"), connector)
        self._bucket: Bucket | None = None
        self._txns: MultipartTxns | None = None
        self._txn_id: str | None = None
        self._staged = self._new_staging()

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> None:
        """Build the client and check the bucket (creating it if allowed): bad credentials fail here."""
        c = self.config
        conc = int(c["s3.max.concurrency"])
        if self._txns is not None:  # opened again (a restarted task): start from a fresh client
            self.close()
        client = make_client(endpoint_url=c["s3.endpoint.url"], region=c["s3.region"], access_key=c["aws.access.key.id"],
                             secret_key=c["aws.secret.access.key"], session_token=c["aws.session.token"],
                             max_attempts=int(c["s3.max.attempts"]), connections=conc + BOOKKEEPING_THREADS,
                             path_style=bool(c["s3.path.style.access"]), ca_bundle=self._ca_bundle())
        self._bucket = Bucket(client, self.bucket_name, c["s3.endpoint.url"])
        self._txns = MultipartTxns(self._bucket, self.layout, part_size=int(c["s3.part.size"]), concurrency=conc)
        self._check_bucket(self._bucket)
        heap.keep_freed_memory()  # each cycle's object bodies reuse the last cycle's pages

    def audit_reader(self, name: str) -> S3Reader:
        """The visible objects read back (see :mod:`eosink.connectors.s3.audit`), on a client of its own:
        an audit neither creates the bucket nor touches the sink's uploads."""
        from eosink.connectors.s3.audit import S3Reader

        c = self.config
        client = make_client(endpoint_url=c["s3.endpoint.url"], region=c["s3.region"], access_key=c["aws.access.key.id"],
                             secret_key=c["aws.secret.access.key"], session_token=c["aws.session.token"],
                             max_attempts=int(c["s3.max.attempts"]), connections=8,
                             path_style=bool(c["s3.path.style.access"]), ca_bundle=self._ca_bundle())
        return S3Reader(name, Bucket(client, self.bucket_name, c["s3.endpoint.url"]), self.layout, self.format)

    def _ca_bundle(self) -> str | None:
        path = self.config["aws.ca.bundle"]
        if path and not os.path.isfile(path):
            raise ConfigError(f"{path} is not a readable file (the CA certificates, PEM, that sign the endpoint's certificate)",
                              key="aws.ca.bundle", source=f"connector '{self.connector}'")
        return str(path) if path else None

    def _check_bucket(self, bucket: Bucket) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            bucket.client.head_bucket(Bucket=bucket.name)
        except ClientError as exc:
            if status_of(exc) == 403:
                # HEAD carries no error body: "wrong secret" and "policy denies" both read 403. A listing
                # of at most one key (the same s3:ListBucket) gets S3's reason, and its error names it.
                bucket.call("list_objects_v2", None, MaxKeys=1)
            if status_of(exc) != 404:
                raise bucket.error(exc, "head_bucket", None) from exc
            if not self.config["s3.bucket.create"]:
                raise FatalError(f"bucket s3://{bucket.name} does not exist at {bucket.endpoint} and "
                                 "s3.bucket.create=false", component=COMPONENT) from exc
            region = self.config["s3.region"]
            kwargs = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
            try:
                bucket.client.create_bucket(Bucket=bucket.name, **kwargs)
            except ClientError as exc2:
                if code_of(exc2) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise bucket.error(exc2, "create_bucket", None) from exc2
        except BotoCoreError as exc:
            raise bucket.error(exc, "head_bucket", None) from exc

    def close(self) -> None:
        if self._txns is not None:
            self._txns.close()
            self._txns = None
        if self._bucket is not None:
            self._bucket.close()
            self._bucket = None

    @property
    def txns(self) -> MultipartTxns:
        if self._txns is None:
            raise FatalError("the sink is not open (call open() first)", component=COMPONENT)
        return self._txns

    @property
    def timings(self) -> CycleTimings:
        return self.txns.timings

    def final_key(self, r: PartitionRange, ext: str | None = None) -> str:
        return self.layout.final_key(r, ext or self.format)

    # -- the two phases ---------------------------------------------------------------------
    def begin_transaction(self, txn_id: str) -> None:
        self._txn_id = txn_id
        self._staged = self._new_staging()

    def _new_staging(self) -> Staging:
        return Staging()

    def write(self, records: Sequence[SinkRecord]) -> None:
        """Stage a slice of the batch, grouped by partition (encoded by the prepare: see :mod:`.staging`)."""
        self._staged.add(records)

    def pre_commit(self, manifest: TxnManifest) -> None:
        staged, self._staged = self._staged, self._new_staging()
        covered = {r.tp for r in manifest.ranges}
        for tp, first in staged.firsts().items():
            if tp not in covered:
                raise FatalError(f"txn {manifest.txn_id}: record {first.tp}@{first.offset} is outside the manifest's "
                                 "partitions", component=COMPONENT)
        encode = ENCODERS[self.format]
        txns = self.txns

        def bodies() -> Iterator[bytes]:  # one at a time: each object's part goes out once its body is made
            return (staged.body(r.tp, encode) for r in manifest.ranges)

        txns.prepare(manifest, bodies, self.format)
        t = txns.timings
        t.group_ms, t.body_ms = staged.group_s * 1000, staged.body_s * 1000

    def commit(self, txn_id: str) -> None:
        self.txns.commit(txn_id)

    def abort(self, txn_id: str) -> None:
        if self._txn_id == txn_id:
            self._staged = self._new_staging()
        self.txns.abort(txn_id)

    def recover(self) -> list[TxnManifest]:
        return self.txns.recover()

    def discard_unprepared(self, partitions: frozenset[TopicPartition]) -> None:
        self.txns.discard_unprepared(partitions)

