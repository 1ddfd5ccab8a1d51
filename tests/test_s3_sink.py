"""The S3 sink against the stack's MinIO (``stack``/``unique`` fixtures).

Each test writes into its own bucket, deleted afterwards. A "crash" of the worker is a sink
instance dropped between two steps: what it wrote to S3 stays, exactly as after a killed worker.
MinIO keeps its data on disk, so the outage test also commits, after the restart, a txn
prepared before it.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import boto3
import pytest
from botocore.stub import Stubber

from eosink.connectors.api.config import MASK
from eosink.connectors.api.errors import ConfigError, FatalError, FencedError, RecordError, RetryableError
from eosink.connectors.api.records import SinkRecord, TopicPartition
from eosink.connectors.s3 import cleanup as s3cleanup
from eosink.connectors.s3 import protocol as s3protocol
from eosink.connectors.s3.sink import S3Sink
from eosink.worker.engine.decision import MemoryDecisionLog
from eosink.worker.engine.task import SinkTask
from eosink.worker.engine.types import CycleOutcome, TaskSettings, TaskState
from eosink.worker.stack import Endpoints
from tests.fakes import ListSource
from tests.sinkkit import manifest_for, prepare, records

MakeSink = Callable[..., S3Sink]


# -- helpers ------------------------------------------------------------------------------------
def keys(client: Any, bucket: str, prefix: str = "") -> list[str]:
    out: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out += [o["Key"] for o in page.get("Contents", [])]
    return sorted(out)


def open_uploads(client: Any, bucket: str) -> list[str]:
    """Keys of the bucket's unfinished multipart uploads (no prefix: MinIO lists a prefix only
    when it is a whole key)."""
    return sorted(u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []))


def pending(connector: str, txn: str) -> str:
    return f"__pending__/{connector}/{quote(txn, safe='')}.json"


def visible(client: Any, bucket: str, connector: str) -> dict[str, bytes]:
    """What a reader sees: the objects under <connector>/ (the sink's data prefix without s3.prefix)."""
    return {k: client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys(client, bucket, connector + "/")}


# -- fixtures -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(stack: Endpoints) -> Any:
    return boto3.client("s3", **stack.s3)


@pytest.fixture
def bucket(client: Any, unique: str) -> Iterator[str]:
    name = unique.replace("_", "-")[:63].strip("-")
    yield name
    try:
        for u in client.list_multipart_uploads(Bucket=name).get("Uploads", []):
            client.abort_multipart_upload(Bucket=name, Key=u["Key"], UploadId=u["UploadId"])
        for k in keys(client, name):
            client.delete_object(Bucket=name, Key=k)
        client.delete_bucket(Bucket=name)
    except Exception:  # noqa: BLE001 - cleanup only (the bucket may never have been created)
        pass


@pytest.fixture
def make_sink(stack: Endpoints, bucket: str, unique: str) -> Iterator[MakeSink]:
    made: list[S3Sink] = []

    def make(connector: str = unique, *, open_: bool = True, **config: Any) -> S3Sink:
        base = {"s3.bucket.name": bucket, "s3.endpoint.url": stack.s3["endpoint_url"], "s3.region": stack.s3["region_name"],
                "aws.access.key.id": stack.s3["aws_access_key_id"], "aws.secret.access.key": stack.s3["aws_secret_access_key"],
                "s3.max.attempts": 2}
        sink = S3Sink(connector, {**base, **config})
        if open_:
            sink.open()
        made.append(sink)
        return sink

    yield make
    for s in made:
        s.close()


# -- visibility, layout, idempotence --------------------------------------------------------------
def test_prepared_objects_are_invisible_until_commit_then_one_object_per_partition_is(make_sink, client, bucket, unique):
    sink = make_sink()
    recs = records("orders", [{"id": i} for i in range(5)]) + records("orders", [{"id": 9}], partition=1, start=7)
    txn = f"{unique}.w.1.1"
    prepare(sink, txn, recs, epoch=4)
    p0 = f"{unique}/orders/0/{0:020d}-{4:020d}.jsonl"
    p1 = f"{unique}/orders/1/{7:020d}-{7:020d}.jsonl"
    assert visible(client, bucket, unique) == {}
    assert keys(client, bucket) == [pending(unique, txn)]  # the prepared txn's record, nothing else
    assert open_uploads(client, bucket) == [p0, p1]  # the data: multipart uploads at the final keys
    sink.commit(txn)
    assert visible(client, bucket, unique) == {p0: b"".join(r.raw_value + b"\n" for r in recs[:5]), p1: b'{"id": 9}\n'}
    assert client.head_object(Bucket=bucket, Key=p0)["Metadata"]["eosink-epoch"] == "4"
    assert client.head_object(Bucket=bucket, Key=p0)["Metadata"]["eosink-txn"] == txn
    assert open_uploads(client, bucket) == []
    sink.close()  # waits for the background delete of the txn's .json
    assert keys(client, bucket, "__pending__/") == []
    assert client.get_object(Bucket=bucket, Key=f"__epochs__/{unique}/orders-0")["Body"].read() == b"4"


def test_jsonl_keeps_the_topics_bytes_and_one_record_per_line(make_sink, client, bucket, unique):
    sink = make_sink(**{"s3.prefix": "lake/raw/"})
    raw = b'{"b": 2,   "a": [1, 2.50]}'
    pretty = b'{\n  "x": 1\n}'
    recs = [SinkRecord("t", 0, 0, None, json.loads(raw), raw), SinkRecord("t", 0, 1, None, json.loads(pretty), pretty),
            SinkRecord("t", 0, 2, None, "plain", b"plain"), SinkRecord("t", 0, 3, None, None, None)]
    prepare(sink, f"{unique}.w.1.1", recs)
    sink.commit(f"{unique}.w.1.1")
    body = client.get_object(Bucket=bucket, Key=f"lake/raw/{unique}/t/0/{0:020d}-{3:020d}.jsonl")["Body"].read()
    assert body == b'{"b": 2,   "a": [1, 2.50]}\n{"x":1}\n"plain"\nnull\n'
    sink.close()
    assert keys(client, bucket, "lake/raw/__pending__/") == [] and keys(client, bucket, "__pending__/") == []


def test_a_batch_written_in_slices_makes_the_same_objects_as_one_write(make_sink, client, bucket, unique):
    """The engine hands the batch over in slices while it reads (write * n): each slice is grouped
    as it arrives (the prepare encodes them), and the objects hold every record once, in offset
    order, as if the batch had come in one write."""
    recs = [r for i in range(30) for r in records("t" if i % 3 else "u", [{"i": i}], partition=i % 2, start=i)]
    whole, sliced = make_sink(f"{unique}-whole"), make_sink(f"{unique}-sliced")
    prepare(whole, f"{unique}.w.1.1", recs)
    m = manifest_for(f"{unique}.w.1.2", sliced.connector, recs, 1)
    sliced.begin_transaction(m.txn_id)
    for i in range(0, len(recs), 7):
        sliced.write(recs[i:i + 7])
    sliced.pre_commit(m)
    whole.commit(f"{unique}.w.1.1")
    sliced.commit(m.txn_id)
    got = visible(client, bucket, sliced.connector)
    assert len(got) == 4 and {k.split("/", 1)[1]: v for k, v in got.items()} == {
        k.split("/", 1)[1]: v for k, v in visible(client, bucket, whole.connector).items()}
    for r in m.ranges:
        want = [x.raw_value + b"\n" for x in recs if x.tp == r.tp]
        assert got[sliced.final_key(r)] == b"".join(want)


def test_a_slice_that_cannot_be_encoded_fails_the_prepare_naming_the_record_and_leaves_nothing_behind(
        make_sink, client, bucket, unique):
    """The prepare encodes while its creates are in flight: a record that cannot be encoded fails it
    after the uploads were created, and they are aborted (and the txn's .json, if it went up, deleted)
    before the error reaches the engine."""
    sink = make_sink()
    good = records("t", [{"n": i} for i in range(4)])
    bad = SinkRecord("t", 0, 4, None, b"\x00\x01", b"\x00\x01")  # value.converter=bytes: no JSON form
    m = manifest_for(f"{unique}.w.1.1", unique, [*good, bad], 1)
    sink.begin_transaction(m.txn_id)
    sink.write(good[:2])
    sink.write([*good[2:], bad])  # staged: the error is the prepare's, as for a batch written at once
    with pytest.raises(RecordError, match=r"t\[0\]@4: value is raw bytes"):
        sink.pre_commit(m)
    assert keys(client, bucket) == [] and open_uploads(client, bucket) == []
    sink.abort(m.txn_id)
    prepare(sink, f"{unique}.w.1.2", good)  # the next txn holds nothing of the failed one's slices
    sink.commit(f"{unique}.w.1.2")
    assert list(visible(client, bucket, unique).values()) == [b"".join(r.raw_value + b"\n" for r in good)]


def test_commit_twice_abort_twice_and_abort_of_unknown_txn_are_ok(make_sink, client, bucket, unique):
    sink = make_sink()
    prepare(sink, f"{unique}.w.1.1", records("t", [{"n": 1}, {"n": 2}]))
    sink.commit(f"{unique}.w.1.1")
    before = visible(client, bucket, unique)
    sink.commit(f"{unique}.w.1.1")
    make_sink().commit(f"{unique}.w.1.1")  # and from a fresh instance, which has no cache
    prepare(sink, f"{unique}.w.1.2", records("t", [{"n": 3}], start=2))
    sink.abort(f"{unique}.w.1.2")
    sink.abort(f"{unique}.w.1.2")
    sink.abort(f"{unique}.w.never")
    assert visible(client, bucket, unique) == before and len(before) == 1
    assert sink.recover() == [] and keys(client, bucket, "__pending__/") == []


def test_abort_deletes_the_pending_prefix_and_nothing_becomes_visible(make_sink, client, bucket, unique):
    sink = make_sink()
    prepare(sink, f"{unique}.w.1.1", records("t", [{"n": 1}]) + records("t", [{"n": 2}], partition=1))
    sink.abort(f"{unique}.w.1.1")
    assert keys(client, bucket) == [] and open_uploads(client, bucket) == []
    sink.commit(f"{unique}.w.1.1")  # a commit replayed after the abort finds nothing to publish
    assert visible(client, bucket, unique) == {}


def test_replayed_batch_lands_on_the_same_key_instead_of_a_duplicate(make_sink, client, bucket, unique):
    recs = records("t", [{"n": i} for i in range(3)])
    first = make_sink()
    prepare(first, f"{unique}.w.1.1", recs, epoch=1)
    first.commit(f"{unique}.w.1.1")
    again = make_sink()  # a new owner re-delivers the same offsets under another txn
    prepare(again, f"{unique}.w.2.1", recs, epoch=2)
    again.commit(f"{unique}.w.2.1")
    objs = visible(client, bucket, unique)
    assert list(objs) == [f"{unique}/t/0/{0:020d}-{2:020d}.jsonl"]
    assert objs[f"{unique}/t/0/{0:020d}-{2:020d}.jsonl"].count(b"\n") == 3


# -- crash and recovery -----------------------------------------------------------------------
def test_worker_crash_between_prepare_and_commit_new_instance_recovers_exactly_that_txn(make_sink, client, bucket, unique):
    first = make_sink()
    prepare(first, f"{unique}.w.1.1", records("t", [{"n": 0}]))
    first.commit(f"{unique}.w.1.1")
    m = prepare(first, f"{unique}.w.1.2", records("t", [{"n": 1}, {"n": 2}], start=1) + records("u", [{"n": 3}], partition=2))
    first.close()  # the worker dies here
    second = make_sink()
    assert second.recover() == [m]
    assert make_sink(unique + "-other").recover() == []  # another connector's recovery does not see it
    second.recover_and_commit(m)
    assert sorted(visible(client, bucket, unique)) == [f"{unique}/t/0/{0:020d}-{0:020d}.jsonl",
                                                        f"{unique}/t/0/{1:020d}-{2:020d}.jsonl",
                                                        f"{unique}/u/2/{0:020d}-{0:020d}.jsonl"]
    assert second.recover() == []


@pytest.mark.parametrize("then", ["commit retried", "recover"])
@pytest.mark.parametrize("crash", ["completes", "cleanup"])
def test_crash_after_the_first_complete_is_finished_by_a_retried_commit_or_by_recover(
        make_sink, client, bucket, unique, monkeypatch, crash, then):
    """A worker that dies with one object completed and another not (or with all completed and
    the txn's .json not yet deleted) leaves a committed txn that the next commit or recover
    completes: the completed object's metadata names the txn, so its upload being gone means
    "committed", not "lost" - and never a second copy of the data."""
    first = make_sink()
    prepare(first, f"{unique}.w.1.1", records("t", [{"n": 1}]) + records("t", [{"n": 2}], partition=1))
    if crash == "completes":
        real = first.txns._complete

        def die_on_partition_1(txn: str, staged: Any) -> Any:
            if "/t/1/" in staged.key:
                raise RetryableError("worker killed during the completes")
            return real(txn, staged)

        monkeypatch.setattr(first.txns, "_complete", die_on_partition_1)
        with pytest.raises(RetryableError):
            first.commit(f"{unique}.w.1.1")
        assert list(visible(client, bucket, unique)) == [f"{unique}/t/0/{0:020d}-{0:020d}.jsonl"]
        assert open_uploads(client, bucket) == [f"{unique}/t/1/{0:020d}-{0:020d}.jsonl"]
    else:
        def die(keys: list[str]) -> None:
            raise RetryableError("worker killed during the cleanup")

        monkeypatch.setattr(first.txns.bucket, "delete", die)
        first.commit(f"{unique}.w.1.1")  # committed: the failed background cleanup is only logged
        first.close()
        assert len(visible(client, bucket, unique)) == 2 and open_uploads(client, bucket) == []
    assert keys(client, bucket, "__pending__/") == [pending(unique, f"{unique}.w.1.1")]
    second = make_sink()
    if then == "commit retried":
        second.commit(f"{unique}.w.1.1")  # NoSuchUpload on a completed object of this txn: already committed
        second.close()  # waits for the background cleanup
    else:
        assert second.recover() == []  # committed (an object names the txn): not a prepared txn any more
    assert keys(client, bucket, "__pending__/") == [] and open_uploads(client, bucket) == []
    assert len(visible(client, bucket, unique)) == 2
    assert make_sink().recover() == []
    make_sink().commit(f"{unique}.w.1.1")


def test_complete_refused_as_invalid_part_while_the_upload_lists_its_parts_is_retried_not_fatal(
        make_sink, client, bucket, unique):
    """MinIO answers InvalidPart for a complete retried after it restarted mid-complete (and
    transiently for parts it has stored). A decided txn whose upload still lists its parts must stay
    committable: the commit is retryable, and the retry - the server answering again - makes the
    object once. (A FatalError here stopped the task with the batch prepared and never delivered.)"""
    import dataclasses

    sink = make_sink()
    prepare(sink, f"{unique}.w.1.1", records("t", [{"n": 1}, {"n": 2}]))
    prepared = sink.txns._prepared[f"{unique}.w.1.1"]
    good = prepared.staged[0]
    refused = dataclasses.replace(good, parts=tuple((n, '"' + "0" * 32 + '"') for n, _ in good.parts))
    sink.txns._prepared[f"{unique}.w.1.1"] = dataclasses.replace(prepared, staged=(refused,))
    with pytest.raises(RetryableError, match=r"InvalidPart\) while the upload lists 1 part") as err:
        sink.commit(f"{unique}.w.1.1")
    assert f"s3://{bucket}/{good.key}" in str(err.value)
    assert visible(client, bucket, unique) == {} and open_uploads(client, bucket) == [good.key]
    sink.txns._prepared[f"{unique}.w.1.1"] = prepared  # the server answers the same parts again
    sink.commit(f"{unique}.w.1.1")
    sink.close()
    assert visible(client, bucket, unique) == {good.key: b'{"n": 1}\n{"n": 2}\n'}
    assert keys(client, bucket, "__pending__/") == [] and open_uploads(client, bucket) == []


def test_upload_aborted_before_commit_is_fatal_naming_the_lifecycle_rule_and_abort_still_tidies(
        make_sink, client, bucket, unique):
    """What a bucket lifecycle rule AbortIncompleteMultipartUpload does to a txn prepared longer
    than its DaysAfterInitiation: the upload vanishes. Told apart from a txn committed before."""
    sink = make_sink()
    m = prepare(sink, f"{unique}.w.1.1", records("t", [{"n": 1}]))
    key = f"{unique}/t/0/{0:020d}-{0:020d}.jsonl"
    for u in client.list_multipart_uploads(Bucket=bucket, Prefix=key)["Uploads"]:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=u["UploadId"])
    with pytest.raises(FatalError, match="lifecycle rule AbortIncompleteMultipartUpload") as err:
        sink.commit(f"{unique}.w.1.1")
    assert f"s3://{bucket}/{key} is gone" in str(err.value)
    with pytest.raises(FatalError, match="AbortIncompleteMultipartUpload"):
        make_sink().commit(f"{unique}.w.1.1")  # a fresh instance reads the same from the .json
    assert visible(client, bucket, unique) == {}
    assert make_sink().recover() == [m]  # still listed: the engine's decision says what to do with it
    make_sink().abort(f"{unique}.w.1.1")
    assert keys(client, bucket, "__pending__/") == [] and open_uploads(client, bucket) == []
    assert make_sink().recover() == []


def test_recover_aborts_uploads_no_prepared_txn_names_once_old_and_keeps_prepared_ones(
        make_sink, client, bucket, unique, monkeypatch):
    sink = make_sink()
    m = prepare(sink, f"{unique}.w.1.1", records("t", [{"n": 1}]))  # prepared: its upload is named by its .json
    orphan = f"{unique}/t/0/{5:020d}-{9:020d}.jsonl"  # a prepare that died before its .json
    client.create_multipart_upload(Bucket=bucket, Key=orphan)
    other = f"{unique}x/t/0/{0:020d}-{0:020d}.jsonl"  # another connector's: never touched
    client.create_multipart_upload(Bucket=bucket, Key=other)
    assert make_sink().recover() == [m]
    assert orphan in open_uploads(client, bucket)  # young: may be a prepare in flight
    monkeypatch.setattr(s3protocol, "ORPHAN_AGE_S", -1.0)
    assert make_sink().recover() == [m]
    assert open_uploads(client, bucket) == sorted([f"{unique}/t/0/{0:020d}-{0:020d}.jsonl", other])
    make_sink().commit(m.txn_id)
    assert list(visible(client, bucket, unique)) == [f"{unique}/t/0/{0:020d}-{0:020d}.jsonl"]


def test_upload_of_a_prepare_killed_before_its_json_is_aborted_by_the_task_that_acquires_its_partition(
        make_sink, client, bucket, unique):
    held, other = TopicPartition("orders", 1), TopicPartition("orders", 10)
    m = prepare(make_sink(), f"{unique}.w.1.1", records("orders", [{"n": 1}], partition=1))  # undecided
    orphan = f"{unique}/orders/1/{5:020d}-{9:020d}.jsonl"  # a prepare killed before its .json: seconds old
    client.create_multipart_upload(Bucket=bucket, Key=orphan)
    live = f"{unique}/orders/10/{0:020d}-{3:020d}.jsonl"  # another task's partition: may be a live prepare
    client.create_multipart_upload(Bucket=bucket, Key=live)
    task = SinkTask(unique, "w2", [make_sink()], ListSource({held: [], other: []}), MemoryDecisionLog(),
                    TaskSettings(commit_interval_s=0), sleep=lambda _s: None)
    task.open()
    task.assign([held])  # recovery: the prepared txn (undecided, not fenced) is reported and kept; the orphan goes
    assert m.txn_id in task.unresolved and keys(client, bucket, "__pending__/") == [pending(unique, m.txn_id)]
    assert open_uploads(client, bucket) == sorted([f"{unique}/orders/1/{0:020d}-{0:020d}.jsonl", live])


def test_engine_commit_failing_after_the_decision_is_committed_once_by_the_restarted_tasks_recovery(
        make_sink, client, bucket, unique, monkeypatch):
    tps = [TopicPartition("orders", 0), TopicPartition("orders", 1)]
    data = {tp: [json.dumps({"p": tp.partition, "i": i}).encode() for i in range(20)] for tp in tps}
    log = MemoryDecisionLog()
    settings = TaskSettings(commit_interval_s=0, commit_retries=1)
    sink = make_sink()

    def unreachable(txn: str) -> None:
        raise RetryableError("S3 unreachable")

    monkeypatch.setattr(sink, "commit", unreachable)
    task = SinkTask(unique, "w1", [sink], ListSource(data), log, settings, sleep=lambda _s: None)
    task.open()
    task.assign(tps)
    assert task.run_cycle().outcome is CycleOutcome.FATAL and task.state is TaskState.FAILED
    assert visible(client, bucket, unique) == {}
    heir = SinkTask(unique, "w2", [make_sink()], ListSource(data), log, settings, sleep=lambda _s: None)
    heir.open()
    heir.assign(tps)  # epoch bump, then recovery: the decision log names the txn -> commit
    assert heir.run_cycle().outcome is CycleOutcome.EMPTY and heir.unresolved == {}
    lines = [json.loads(x) for body in visible(client, bucket, unique).values() for x in body.splitlines()]
    assert sorted((v["p"], v["i"]) for v in lines) == [(p, i) for p in (0, 1) for i in range(20)]


def test_epoch_object_a_newer_eosink_wrote_is_refused_not_misread(make_sink, client, bucket, unique):
    sink = make_sink()
    m = prepare(sink, f"{unique}.w.1.1", records("t", [{"n": 1}]))
    sink.commit(m.txn_id)
    key = f"__epochs__/{unique}/t-0"
    assert client.head_object(Bucket=bucket, Key=key)["Metadata"] == {"eosink-format": "1"}
    client.put_object(Bucket=bucket, Key=key, Body=b"7", Metadata={"eosink-format": "2"})  # a newer release's object
    with pytest.raises(FatalError, match=rf"epoch object at s3://{bucket}/{key} is in format 2.*reads format 1 at most"):
        prepare(make_sink(), f"{unique}.w.2.1", records("t", [{"n": 2}], start=1), epoch=2)
    assert pending(unique, f"{unique}.w.2.1") not in keys(client, bucket, "__pending__/")  # nothing left behind
    assert open_uploads(client, bucket) == []


# -- the epoch fence ----------------------------------------------------------------------------
def test_stale_epoch_prepare_is_refused_as_fenced_and_leaves_nothing_pending(make_sink, client, bucket, unique):
    owner = make_sink()
    prepare(owner, f"{unique}.w.2.1", records("t", [{"n": 1}]), epoch=2)
    owner.commit(f"{unique}.w.2.1")
    zombie = make_sink()
    with pytest.raises(FencedError, match="epoch 1 for t-0 is older than 2"):
        prepare(zombie, f"{unique}.w.1.9", records("t", [{"n": 2}], start=1), epoch=1)
    # Only the owner's committed txn (its .json goes with the next ones): nothing of the zombie's.
    assert keys(client, bucket, "__pending__/") == [pending(unique, f"{unique}.w.2.1")] and zombie.recover() == []
    assert open_uploads(client, bucket) == []  # its upload aborted, not left to a lifecycle rule
    prepare(owner, f"{unique}.w.2.2", records("t", [{"n": 2}], start=1), epoch=2)  # the owner goes on
    owner.commit(f"{unique}.w.2.2")
    assert len(visible(client, bucket, unique)) == 2


def test_zombie_that_saw_its_own_epoch_is_still_fenced_once_a_new_owner_raised_it(make_sink, client, bucket, unique):
    """The fence lists the epoch objects and reads only those whose ETag is not the MD5 of the
    epoch it last saw: an instance that committed at epoch 1 must still see the raise to 2."""
    zombie = make_sink()
    prepare(zombie, f"{unique}.w.1.1", records("t", [{"n": 1}]), epoch=1)
    zombie.commit(f"{unique}.w.1.1")  # the zombie now knows epoch 1 is stored for t-0
    owner = make_sink()
    prepare(owner, f"{unique}.w.2.1", records("t", [{"n": 2}], start=1), epoch=2)
    owner.commit(f"{unique}.w.2.1")
    with pytest.raises(FencedError, match="epoch 1 for t-0 is older than 2"):
        prepare(zombie, f"{unique}.w.1.2", records("t", [{"n": 3}], start=2), epoch=1)
    assert zombie.recover() == [] and keys(client, bucket, "__pending__/") == [] and open_uploads(client, bucket) == []
    prepare(owner, f"{unique}.w.2.2", records("t", [{"n": 3}], start=2), epoch=2)  # the owner's cached epoch is current
    owner.commit(f"{unique}.w.2.2")
    assert len(visible(client, bucket, unique)) == 3


def test_epoch_object_is_raised_at_commit_and_never_lowered_by_an_older_decided_txn(make_sink, client, bucket, unique):
    old = make_sink()
    m_old = prepare(old, f"{unique}.w.2.1", records("t", [{"n": 1}]), epoch=2)  # decided, commit delayed
    new = make_sink()
    prepare(new, f"{unique}.w.3.1", records("t", [{"n": 2}], start=1), epoch=3)
    new.commit(f"{unique}.w.3.1")
    make_sink().recover_and_commit(m_old)  # the decision stands: it is committed, late
    assert client.get_object(Bucket=bucket, Key=f"__epochs__/{unique}/t-0")["Body"].read() == b"3"
    assert len(visible(client, bucket, unique)) == 2


def test_epoch_raise_starts_from_what_the_fence_listed_and_a_stale_listing_never_lowers_it(
        make_sink, client, bucket, unique, monkeypatch):
    """The first compare-and-set of a raise uses the ETag (or absence) the prepare's fence listed,
    without reading the epoch object again; when another writer raised it since, that attempt
    loses the compare-and-set and the object is read: the epoch is never lowered."""
    sink = make_sink()
    calls: list[tuple[str, str | None]] = []
    real = sink.txns.bucket.call

    def call(op: str, key: str | None, **kwargs: Any) -> Any:
        calls.append((op, key))
        return real(op, key, **kwargs)

    monkeypatch.setattr(sink.txns.bucket, "call", call)
    epoch_key = f"__epochs__/{unique}/t-0"
    prepare(sink, f"{unique}.w.2.1", records("t", [{"n": 1}]), epoch=2)
    sink.commit(f"{unique}.w.2.1")
    assert [op for op, key in calls if key == epoch_key] == ["put_object"]  # no read: the fence saw none
    calls.clear()
    prepare(sink, f"{unique}.w.2.2", records("t", [{"n": 9}], start=9), epoch=2)
    sink.commit(f"{unique}.w.2.2")  # the usual cycle: its epoch is stored already
    assert [op for op, key in calls if key == epoch_key] == []
    assert client.get_object(Bucket=bucket, Key=epoch_key)["Body"].read() == b"2"
    calls.clear()
    prepare(sink, f"{unique}.w.3.1", records("t", [{"n": 2}], start=1), epoch=3)  # fence: ETag = MD5("2")
    sink.commit(f"{unique}.w.3.1")
    assert [op for op, key in calls if key == epoch_key] == ["put_object"]  # IfMatch on the listed ETag
    assert client.get_object(Bucket=bucket, Key=epoch_key)["Body"].read() == b"3"
    prepare(sink, f"{unique}.w.4.1", records("t", [{"n": 3}], start=2), epoch=4)  # fence: ETag = MD5("3")
    other = make_sink()
    prepare(other, f"{unique}.w.5.1", records("t", [{"n": 4}], start=3), epoch=5)
    other.commit(f"{unique}.w.5.1")  # raised to 5 after this sink's fence listed 3
    calls.clear()
    sink.commit(f"{unique}.w.4.1")  # a decided txn committed late: its CAS from ETag "3" loses, then reads 5
    assert [op for op, key in calls if key == epoch_key] == ["put_object", "get_object"]
    assert client.get_object(Bucket=bucket, Key=epoch_key)["Body"].read() == b"5"
    assert len(visible(client, bucket, unique)) == 5


def test_committed_txns_json_objects_go_in_one_delete_and_recover_finishes_what_is_left(
        make_sink, client, bucket, unique, monkeypatch):
    sink = make_sink()
    deletes: list[list[str]] = []
    real = sink.txns.bucket.delete

    def delete(keys_: list[str]) -> None:
        deletes.append(keys_)
        real(keys_)

    monkeypatch.setattr(sink.txns.bucket, "delete", delete)
    n = s3cleanup.CLEANUP_BATCH
    txns = [f"{unique}.w.1.{i + 1}" for i in range(n + 1)]
    for i, txn in enumerate(txns):
        prepare(sink, txn, records("t", [{"n": i}], start=i))
        sink.commit(txn)
    sink.txns.cleanup.reap(block=True)
    assert deletes == [[pending(unique, t) for t in txns[:n]]]  # one request for the first n
    assert keys(client, bucket, "__pending__/") == [pending(unique, txns[n])]
    assert make_sink().recover() == []  # a committed txn's .json left behind (as after a crash): finished
    assert keys(client, bucket, "__pending__/") == [] and open_uploads(client, bucket) == []
    assert len(visible(client, bucket, unique)) == n + 1
    sink.close()  # deletes what it still holds: already gone, no error
    assert deletes[-1] == [pending(unique, txns[n])]


def test_a_failed_cleanup_goes_again_with_the_next_one(make_sink, client, bucket, unique, monkeypatch):
    sink = make_sink()
    deletes: list[list[str]] = []
    real = sink.txns.bucket.delete

    def delete_failing_once(keys_: list[str]) -> None:
        deletes.append(keys_)
        if len(deletes) == 1:
            raise RetryableError("S3 unreachable for a moment")
        real(keys_)

    monkeypatch.setattr(sink.txns.bucket, "delete", delete_failing_once)
    n = s3cleanup.CLEANUP_BATCH
    txns = [f"{unique}.w.1.{i + 1}" for i in range(n + 1)]
    for i, txn in enumerate(txns[:n]):
        prepare(sink, txn, records("t", [{"n": i}], start=i))
        sink.commit(txn)
    sink.txns.cleanup.reap(block=True)  # the failed delete is logged, its keys kept for the next
    assert len(keys(client, bucket, "__pending__/")) == n
    prepare(sink, txns[n], records("t", [{"n": n}], start=n))
    sink.commit(txns[n])
    sink.txns.cleanup.reap(block=True)
    assert deletes[1] == [pending(unique, t) for t in txns] and keys(client, bucket, "__pending__/") == []


def test_plain_http_endpoint_signs_the_sha256_of_every_part_which_the_server_checks(make_sink, stack, unique):
    """Over http botocore signs each body's SHA-256, which the server recomputes: the sink leaves
    out the CRC32 botocore would add on top, and the bytes stay verified end to end."""
    import hashlib

    assert stack.s3["endpoint_url"].startswith("http://")
    sink = make_sink()
    sent: list[tuple[str, bytes, str]] = []

    def record(request: Any, **_kw: Any) -> None:
        if "uploadId=" in request.url and request.method == "PUT":
            body = request.body if isinstance(request.body, bytes) else request.body.getvalue()
            sent.append((request.headers["X-Amz-Content-SHA256"].decode(), body,
                         ",".join(h for h in request.headers if h.lower().startswith("x-amz-checksum"))))

    sink.txns.bucket.client.meta.events.register("before-send.s3.UploadPart", record)
    prepare(sink, f"{unique}.w.1.1", records("t", [{"n": i} for i in range(3)]))
    assert len(sent) == 1
    digest, body, checksums = sent[0]
    assert digest == hashlib.sha256(body).hexdigest() and body.count(b"\n") == 3 and checksums == ""


@pytest.mark.parametrize("topics", ["one topic", "two topics"])
def test_record_outside_the_manifests_partitions_is_fatal_naming_it_and_nothing_is_uploaded(
        make_sink, client, bucket, unique, topics):
    sink = make_sink()
    recs = records("t", [{"n": 1}]) + (records("u", [{"n": 2}], partition=1) if topics == "two topics" else [])
    m = manifest_for(f"{unique}.w.1.1", unique, recs, 1)
    strays = [records("x", [{"n": 3}], start=7)[0], records("t", [{"n": 3}], partition=5, start=7)[0]]
    for stray in strays:  # another topic at a partition of the manifest; a partition it does not cover
        sink.begin_transaction(m.txn_id)
        sink.write([*recs, stray])
        with pytest.raises(FatalError, match=rf"record {stray.topic}-{stray.partition}@7 is outside the manifest"):
            sink.pre_commit(m)
    assert keys(client, bucket) == [] and open_uploads(client, bucket) == []


# -- formats ----------------------------------------------------------------------------------
def test_parquet_objects_are_readable_by_pyarrow_with_every_field_and_the_kafka_columns(make_sink, client, bucket, unique):
    import pyarrow.parquet as pq

    sink = make_sink(format="parquet")
    values = [{"id": 1, "name": "a"}, {"id": 2, "amount": 2.5}, {"id": 3, "name": "c", "tags": ["x", "y"]}]
    prepare(sink, f"{unique}.w.1.1", records("orders", values, partition=3, start=10))
    assert visible(client, bucket, unique) == {}
    sink.commit(f"{unique}.w.1.1")
    key = f"{unique}/orders/3/{10:020d}-{12:020d}.parquet"
    table = pq.read_table(io.BytesIO(visible(client, bucket, unique)[key]))
    assert table.to_pylist() == [
        {"id": 1, "name": "a", "amount": None, "tags": None, "__topic": "orders", "__partition": 3, "__offset": 10},
        {"id": 2, "name": None, "amount": 2.5, "tags": None, "__topic": "orders", "__partition": 3, "__offset": 11},
        {"id": 3, "name": "c", "amount": None, "tags": ["x", "y"], "__topic": "orders", "__partition": 3, "__offset": 12},
    ]


def test_parquet_refuses_non_object_values_and_conflicting_types_as_record_errors(make_sink, unique):
    sink = make_sink(format="parquet")
    with pytest.raises(RecordError, match=r"t\[0\]@1: format=parquet needs JSON object values"):
        prepare(sink, f"{unique}.w.1.1", records("t", [{"a": 1}, [1, 2]]))
    with pytest.raises(RecordError, match="no single Parquet schema fits the batch"):
        prepare(sink, f"{unique}.w.1.2", records("t", [{"a": 1}, {"a": "one"}]))


def test_objects_over_the_part_size_are_uploaded_in_parts_and_arrive_whole(make_sink, client, bucket, unique):
    sink = make_sink(**{"s3.part.size": 5 * 1024 * 1024})
    recs = records("t", [{"i": i, "pad": "x" * 1000} for i in range(6000)])  # ~6 MB: two parts
    prepare(sink, f"{unique}.w.1.1", recs)
    key = f"{unique}/t/0/{0:020d}-{5999:020d}.jsonl"
    (upload,) = client.list_multipart_uploads(Bucket=bucket, Prefix=key)["Uploads"]
    sizes = [p["Size"] for p in client.list_parts(Bucket=bucket, Key=key, UploadId=upload["UploadId"])["Parts"]]
    assert sizes[0] == 5 * 1024 * 1024 and len(sizes) == 2 and visible(client, bucket, unique) == {}
    make_sink().commit(f"{unique}.w.1.1")  # an instance that did not prepare it reads the parts back
    assert client.head_object(Bucket=bucket, Key=key)["ETag"].strip('"').endswith("-2")
    assert visible(client, bucket, unique)[key] == b"".join(r.raw_value + b"\n" for r in recs)


# -- errors -------------------------------------------------------------------------------------
@pytest.mark.chaos
def test_s3_down_is_retryable_for_every_operation_and_the_sink_works_once_it_is_back(make_sink, client, bucket, unique):
    from eosink.worker.stack import start_component, stop_component

    sink = make_sink(**{"s3.max.attempts": 1})
    m = prepare(sink, f"{unique}.w.1.1", records("t", [{"n": 1}]))
    stop_component("s3")
    try:
        with pytest.raises(RetryableError, match=r"cannot reach http://127.0.0.1:\d+ \(s3.endpoint.url\)"):
            sink.commit(f"{unique}.w.1.1")
        with pytest.raises(RetryableError):
            prepare(sink, f"{unique}.w.1.2", records("t", [{"n": 2}], start=1))
        with pytest.raises(RetryableError):
            sink.abort(f"{unique}.w.1.2")
        with pytest.raises(RetryableError):
            sink.recover()
        with pytest.raises(RetryableError):
            sink.open()
    finally:
        start_component("s3")
    sink.open()
    assert sink.recover() == [m]  # MinIO kept the upload and the txn's .json across the restart
    sink.commit(f"{unique}.w.1.1")
    prepare(sink, f"{unique}.w.1.3", records("t", [{"n": 3}], start=2))
    sink.commit(f"{unique}.w.1.3")
    assert list(visible(client, bucket, unique)) == [f"{unique}/t/0/{0:020d}-{0:020d}.jsonl",
                                                     f"{unique}/t/0/{2:020d}-{2:020d}.jsonl"]


def test_missing_bucket_without_create_is_fatal_and_names_the_bucket(make_sink, bucket):
    sink = make_sink(open_=False, **{"s3.bucket.create": False})
    with pytest.raises(FatalError, match=f"bucket s3://{bucket} does not exist at http://127.0.0.1"):
        sink.open()


def test_bucket_deleted_under_a_running_sink_is_fatal_naming_bucket_and_key(make_sink, client, bucket, unique):
    sink = make_sink()
    client.delete_bucket(Bucket=bucket)
    with pytest.raises(FatalError, match=f"s3://{bucket}/.*: bucket {bucket} does not exist \\(s3.bucket.name\\)"):
        prepare(sink, f"{unique}.w.1.1", records("t", [{"n": 1}]))


def test_wrong_credentials_are_fatal_naming_the_keys_and_endpoint_and_lose_no_prepared_txn(make_sink, stack, bucket, unique):
    good = make_sink()
    m = prepare(good, f"{unique}.w.1.1", records("t", [{"n": 1}]))
    bad = make_sink(open_=False, **{"aws.secret.access.key": "not-the-secret"})
    with pytest.raises(FatalError, match="access denied") as err:
        bad.open()
    msg = str(err.value)
    assert f"s3://{bucket} at {stack.s3['endpoint_url']}" in msg and "aws.access.key.id / aws.secret.access.key" in msg
    assert "not-the-secret" not in msg
    heir = make_sink()
    assert heir.recover() == [m]
    heir.commit(m.txn_id)


def test_endpoint_down_is_retryable_naming_the_endpoint(make_sink):
    from tests.procs import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    sink = make_sink(open_=False, **{"s3.endpoint.url": url, "s3.max.attempts": 1})
    with pytest.raises(RetryableError, match=f"cannot reach {url} \\(s3.endpoint.url\\)"):
        sink.open()


@pytest.mark.parametrize(("code", "status", "error", "match"), [
    ("SlowDown", 503, RetryableError, "SlowDown"),
    ("InternalError", 500, RetryableError, "InternalError"),
    ("BadGateway", 502, RetryableError, "HTTP 502"),
    ("AccessDenied", 403, FatalError, "access denied .* policy of bucket"),
    ("NoSuchBucket", 404, FatalError, "bucket .* does not exist"),
])
def test_s3_error_codes_map_to_outcome_classes_and_name_bucket_and_key(make_sink, bucket, unique, code, status, error, match):
    sink = make_sink()
    with Stubber(sink.txns.bucket.client) as stubber:
        # The stubbed answer goes to the fence's LIST of the epoch objects (the creates that run
        # alongside it find no stubbed answer and fail too; the fence's error is the one raised).
        stubber.add_client_error("list_objects_v2", service_error_code=code, http_status_code=status)
        with pytest.raises(error, match=match) as err:
            prepare(sink, f"{unique}.w.1.1", records("t", [{"n": 1}]))
    assert f"s3://{bucket}/__epochs__/{unique}/" in str(err.value)


def test_an_open_sink_reuses_freed_body_pages_so_the_next_cycle_takes_no_page_faults(stack, bucket):
    """Fresh pages cost a fault each on first touch (~3,000 per 12 MB cycle, more than the
    encoding on this VM); after open() the next cycle's bodies land on the last cycle's pages."""
    script = f"""
import resource
from eosink.connectors.s3 import S3Sink
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def cycle():
    f = faults()
    bodies = [b"\\n".join([b"x" * 239] * 12500) for _ in range(4)]  # four 3 MB objects
    del bodies
    return faults() - f
before = [cycle() for _ in range(3)]
sink = S3Sink("c", {{"s3.bucket.name": {bucket!r}, "s3.endpoint.url": {stack.s3["endpoint_url"]!r},
                    "aws.access.key.id": {stack.s3["aws_access_key_id"]!r},
                    "aws.secret.access.key": {stack.s3["aws_secret_access_key"]!r}}})
sink.open()
cycle()
after = [cycle() for _ in range(3)]
sink.close()
print(min(before), max(after))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    before, after = map(int, out.stdout.split())
    assert before > 2000 and after < 100, (before, after)


def test_secrets_are_masked_and_config_is_validated():
    cfg = {"s3.bucket.name": "b", "aws.access.key.id": "AKIA1", "aws.secret.access.key": "sekrit", "aws.session.token": "tok"}
    masked = S3Sink.CONFIG.mask(cfg)
    assert masked["aws.secret.access.key"] == MASK and masked["aws.session.token"] == MASK
    assert masked["aws.access.key.id"] == "AKIA1"
    with pytest.raises(ConfigError, match="s3.part.size"):
        S3Sink("c", {**cfg, "s3.part.size": 1024})
    with pytest.raises(ConfigError, match="format"):
        S3Sink("c", {**cfg, "format": "csv"})
    with pytest.raises(ConfigError, match="s3.bucket.name"):
        S3Sink("c", {})
