"""The filesystem sink's two line formats, and a full volume (its 2PC behaviour is in test_conformance.py)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eosink.connectors.api.errors import ConfigError, RetryableError
from eosink.connectors.api.records import SinkRecord, TopicPartition
from eosink.connectors.common.durable import describe_os_error
from eosink.connectors.filesystem import ORPHAN_TMP_S, FilesystemSink
from tests.diskkit import Filler, volume
from tests.sinkkit import prepare


def _records() -> list[SinkRecord]:
    raws = [b'{"id": 1, "s": "caf\\u00e9"}', b'{"id": 2}', b'"a string"']
    return [SinkRecord("t.x", 0, i, b"k" if i == 0 else None, json.loads(r), r, (("eosink.id", b"job/run/0/0"),) if i == 0 else ())
            for i, r in enumerate(raws)]


def _committed_bytes(sink: FilesystemSink) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(sink.committed_dir.glob("*.jsonl")))


def test_raw_format_writes_each_value_exactly_as_it_was_on_the_topic(tmp_path):
    sink = FilesystemSink("c", {"file.path": str(tmp_path), "file.format": "raw"})
    sink.open()
    recs = _records()
    prepare(sink, "c.w.1.1", recs)
    assert _committed_bytes(sink) == b""
    sink.commit("c.w.1.1")
    assert _committed_bytes(sink) == b"".join(r.raw_value + b"\n" for r in recs)


def test_jsonl_format_is_one_object_per_record_that_jq_reads(tmp_path):
    sink = FilesystemSink("c", {"file.path": str(tmp_path)})
    sink.open()
    prepare(sink, "c.w.1.1", _records())
    sink.commit("c.w.1.1")
    rows = [json.loads(line) for line in _committed_bytes(sink).splitlines()]
    assert [r["offset"] for r in rows] == [0, 1, 2]
    assert rows[0] == {"topic": "t.x", "partition": 0, "offset": 0, "key": "k", "id": "job/run/0/0",
                       "value": {"id": 1, "s": "café"}}
    assert rows[1]["id"] == "t.x/0/1" and rows[1]["key"] is None and rows[2]["value"] == "a string"
    jq = subprocess.run(["sh", "-c", "command -v jq"], capture_output=True)
    if jq.returncode == 0:
        out = subprocess.run(["jq", "-c", ".value"], input=_committed_bytes(sink), capture_output=True, check=True)
        assert out.stdout.splitlines()[1] == b'{"id":2}'


def test_unknown_format_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="file.format"):
        FilesystemSink("c", {"file.path": str(tmp_path), "file.format": "csv"})


def test_pretty_printed_json_value_is_written_as_one_line_its_own_reader_parses(tmp_path):
    """A producer that pretty-prints puts line breaks inside a record's bytes; written as they
    are, one record becomes several lines and ``read_committed`` (or jq) fails on the first."""
    sink = FilesystemSink("c", {"file.path": str(tmp_path)})
    sink.open()
    pretty = b'{\n  "id": 1,\n  "s": "caf\\u00e9",\n  "tags": [\n    "a"\n  ]\n}'
    compact = b'{"id": 2}'
    recs = [SinkRecord("t.x", 0, 0, None, json.loads(pretty), pretty), SinkRecord("t.x", 0, 1, None, json.loads(compact), compact)]
    prepare(sink, "c.w.1.1", recs)
    sink.commit("c.w.1.1")
    lines = _committed_bytes(sink).splitlines()
    assert len(lines) == 2
    assert [json.loads(x)["value"] for x in lines] == [{"id": 1, "s": "café", "tags": ["a"]}, {"id": 2}]
    assert lines[1].endswith(b'"value":{"id": 2}}')  # a value without a line break stays the topic's bytes
    assert [r["value"]["id"] for r in sink.read_committed()] == [1, 2]


def _big_records(n: int) -> list[SinkRecord]:
    raws = [json.dumps({"id": i, "payload": "x" * 200}).encode() for i in range(n)]
    return [SinkRecord("t.x", 0, i, None, json.loads(r), r) for i, r in enumerate(raws)]


def _leftovers(sink: FilesystemSink) -> list[str]:
    return sorted(p.name for p in sink.prepared_dir.iterdir())


@pytest.mark.parametrize("kind", ["tmpfs", "ext4"])
def test_prepare_on_a_full_volume_is_retryable_names_the_path_and_leaves_no_half_written_file(tmp_path, kind):
    with volume(tmp_path / "vol", "4m", kind) as vol:
        sink = FilesystemSink("c", {"file.path": str(vol.path)})
        sink.open()
        filler = Filler(vol.path).fill()
        recs = _big_records(2000)  # ~450 kB: more than any page the filler leaves
        with pytest.raises(RetryableError) as err:
            prepare(sink, "c.w.1.1", recs)
        message = str(err.value)
        assert "disk full" in message and str(vol.path) in message, message
        assert str(sink.prepared_dir / "c.w.1.1.") in message, message  # the txn's manifest or data, whichever hit it
        assert _leftovers(sink) == [], "a half-written prepared file stayed on the full volume"
        assert sink.recover() == []
        sink.abort("c.w.1.1")
        filler.release()
        prepare(sink, "c.w.1.2", recs)
        sink.commit("c.w.1.2")
        assert [r["offset"] for r in sink.read_committed()] == list(range(2000))
        assert _leftovers(sink) == []


@pytest.mark.parametrize("kind", ["tmpfs", "ext4"])
def test_commit_on_a_full_volume_keeps_the_batch_prepared_and_completes_once_space_returns(tmp_path, kind):
    with volume(tmp_path / "vol", "4m", kind) as vol:
        sink = FilesystemSink("c", {"file.path": str(vol.path)})
        sink.open()
        prepare(sink, "c.w.1.1", _big_records(10), epoch=3)
        filler = Filler(vol.path).fill()  # the first commit must write the partition's epoch fence
        with pytest.raises(RetryableError, match="disk full") as err:
            sink.commit("c.w.1.1")
        assert str(sink.epochs_dir) in str(err.value)
        assert sink.read_committed() == [], "visible before its commit completed"
        assert [m.txn_id for m in sink.recover()] == ["c.w.1.1"], "the decided batch must stay prepared"
        filler.release()
        sink.commit("c.w.1.1")  # the retry in place
        assert len(sink.read_committed()) == 10 and sink.recover() == []
        assert (sink.epochs_dir / "t.x-0").read_text() == "3"


def test_quota_exceeded_is_told_apart_from_a_full_disk_and_names_the_file():
    """EDQUOT cannot be provoked as root (root ignores quotas): the errno as the kernel reports it."""
    exc = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/v/c/prepared/x.jsonl")
    assert describe_os_error(exc, "/v/c").startswith(
        "disk quota exceeded: no space left on the volume of /v/c writing /v/c/prepared/x.jsonl ([Errno 122] ")
    other = OSError(errno.EACCES, os.strerror(errno.EACCES), "/v/c/prepared")
    assert describe_os_error(other, "/v/c") == "/v/c/prepared: [Errno 13] Permission denied"


def test_recovery_removes_the_half_written_files_of_a_writer_killed_mid_write_but_not_a_write_in_progress(tmp_path):
    sink = FilesystemSink("c", {"file.path": str(tmp_path)})
    sink.open()
    killed = sink.prepared_dir / "c.w.1.1.jsonl.tmp"
    killed.write_bytes(b'{"half": ')
    old = time.time() - ORPHAN_TMP_S - 60
    os.utime(killed, (old, old))
    fence = sink.epochs_dir / "t.x-0.tmp"
    fence.write_bytes(b"")
    os.utime(fence, (old, old))
    writing = sink.prepared_dir / "c.w.2.1.jsonl.tmp"
    writing.write_bytes(b'{"being": ')
    assert sink.recover() == []
    assert not killed.exists() and not fence.exists()
    assert writing.exists(), "recovery removed the file of a write in progress"


_KILLED_MID_PREPARE = """
import os, signal, sys
from eosink.connectors.filesystem import FilesystemSink
from tests.sinkkit import prepare, records

sink = FilesystemSink("c", {"file.path": sys.argv[1]})
sink.open()
encode = sink._encode
slices = 0

def killed_at_the_second_slice(recs):
    global slices
    slices += 1
    if slices == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return encode(recs)

sink._encode = killed_at_the_second_slice
prepare(sink, sys.argv[2], records("t", [{"id": i} for i in range(50_000)], partition=int(sys.argv[3])), epoch=1)
"""


def test_prepare_sigkilled_mid_write_is_discarded_once_a_newer_epoch_holds_its_partition(tmp_path):
    """A writer killed inside pre_commit leaves files no recover() names; the next owner removes them.

    A second prepare, of another partition and killed the same way, stands for a live writer elsewhere:
    it is left alone until its own partition is acquired."""
    for txn, partition in (("c.w1.1.7", 0), ("c.w2.1.3", 1)):
        proc = subprocess.run([sys.executable, "-c", _KILLED_MID_PREPARE, str(tmp_path), txn, str(partition)],
                              cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=60)
        assert proc.returncode == -signal.SIGKILL, proc.stderr
    sink = FilesystemSink("c", {"file.path": str(tmp_path)})
    sink.open()
    left = sorted(p.name for p in sink.prepared_dir.iterdir())
    assert left == ["c.w1.1.7.jsonl.tmp", "c.w1.1.7.manifest.json", "c.w2.1.3.jsonl.tmp", "c.w2.1.3.manifest.json"]
    assert sink.recover() == [], "a txn whose data never landed is not prepared"
    sink.discard_unprepared(frozenset({TopicPartition("t", 0)}))
    assert sorted(p.name for p in sink.prepared_dir.iterdir()) == ["c.w2.1.3.jsonl.tmp", "c.w2.1.3.manifest.json"]
    sink.discard_unprepared(frozenset({TopicPartition("t", 1)}))
    assert list(sink.prepared_dir.iterdir()) == []
    assert sink.read_committed() == []


def test_manifest_left_by_a_commit_cut_short_goes_and_data_without_a_manifest_goes_once_stale(tmp_path):
    sink = FilesystemSink("c", {"file.path": str(tmp_path)})
    sink.open()
    recs = [SinkRecord("t", 0, i, None, {"id": i}, json.dumps({"id": i}).encode()) for i in range(3)]
    prepare(sink, "c.w.1.1", recs)
    manifest = (sink.prepared_dir / "c.w.1.1.manifest.json").read_bytes()
    sink.commit("c.w.1.1")
    (sink.prepared_dir / "c.w.1.1.manifest.json").write_bytes(manifest)  # killed before the manifest went
    orphan = sink.prepared_dir / "c.w.2.1.jsonl"
    orphan.write_bytes(b'{"id": 9}\n')
    assert sink.recover() == []
    assert sorted(p.name for p in sink.prepared_dir.iterdir()) == ["c.w.2.1.jsonl"], "not yet stale: kept"
    old = time.time() - ORPHAN_TMP_S - 60
    os.utime(orphan, (old, old))
    assert sink.recover() == [] and list(sink.prepared_dir.iterdir()) == []
    assert [r["value"]["id"] for r in sink.read_committed()] == [0, 1, 2]
