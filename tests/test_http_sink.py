"""The HTTP sink against the reference server run as a real process (one per module, plus one per
test that restarts or configures its own), and against a scripted stub for 5xx and timeouts.

A "crash" of the worker is a sink instance dropped between prepare and commit; a crash of the
server is SIGKILL of its process: whatever it acknowledged must be on disk.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from eosink.connectors.api.config import MASK
from eosink.connectors.api.errors import ConfigError, FatalError, FencedError, RecordError, RetryableError
from eosink.connectors.api.records import PartitionRange, SinkRecord, TopicPartition, TxnManifest
from eosink.connectors.http.reference_server import Store
from eosink.connectors.http.sink import HttpSink
from eosink.worker.engine.decision import MemoryDecisionLog
from eosink.worker.engine.task import SinkTask
from eosink.worker.engine.types import CycleOutcome, TaskSettings, TaskState
from eosink.worker.stack.proc import free_port
from tests.fakes import ListSource
from tests.sinkkit import prepare, records

REPO = Path(__file__).resolve().parent.parent


# -- helpers ------------------------------------------------------------------------------------
class ServerProc:
    """``python -m eosink.connectors.http.reference_server`` as a child process."""

    def __init__(self, data_dir: Path, token: str | None = None) -> None:
        self.data_dir, self.token, self.port = data_dir, token, free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerProc:
        argv = [sys.executable, "-m", "eosink.connectors.http.reference_server", "--port", str(self.port), "--data-dir", str(self.data_dir)]
        if self.token:
            argv += ["--token", self.token]
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 15
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1):
                    return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"server exited: {self.proc.stderr.read().decode() if self.proc.stderr else ''}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError("server did not answer /health in 15 s") from None
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def committed(self) -> list[dict[str, Any]]:
        path = self.data_dir / "committed.jsonl"
        return [json.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []

    def visible(self, connector: str) -> list[Any]:
        return [v for line in self.committed() if line["connector"] == connector for v in line["records"]]


class Stub:
    """A scripted server: answers (status, body, delay_s[, headers]) in turn, then 200; records requests."""

    def __init__(self, script: Sequence[tuple[Any, ...]]) -> None:
        self.script = list(script)
        self.requests: list[tuple[str, str, bytes, dict[str, str]]] = []
        stub = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                stub.requests.append((self.command, self.path, body, dict(self.headers)))
                status, text, delay, *extra = stub.script.pop(0) if stub.script else (200, '{"status":"ok"}', 0.0)
                time.sleep(delay)
                data = text.encode()
                try:
                    self.send_response(status)
                    for k, v in (extra[0] if extra else {}).items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client timed out and left

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- fixtures -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    srv = ServerProc(tmp_path_factory.mktemp("http-ref")).start()
    yield srv
    srv.kill()


@pytest.fixture
def make_sink() -> Iterator[Any]:
    made: list[HttpSink] = []

    def make(url: str, connector: str, **config: Any) -> HttpSink:
        sleeps = config.pop("_sleeps", None)
        sink = HttpSink(connector, {"http.url": url, "http.retry.backoff.ms": 10, **config},
                        sleep=(sleeps.append if sleeps is not None else time.sleep))
        sink.open()
        made.append(sink)
        return sink

    yield make
    for s in made:
        s.close()


@pytest.fixture
def stub() -> Iterator[Any]:
    made: list[Stub] = []

    def make(*script: tuple[Any, ...]) -> Stub:
        made.append(Stub(script))
        return made[-1]

    yield make
    for s in made:
        s.close()


# -- visibility and idempotence -----------------------------------------------------------------
def test_prepared_batch_is_invisible_until_commit_then_every_record_is_visible_once(server, make_sink, unique):
    sink = make_sink(server.url, unique)
    recs = records("orders", [{"id": i} for i in range(5)]) + records("orders", [{"id": 10 + i} for i in range(3)], partition=1)
    prepare(sink, f"{unique}.w.1.1", recs)
    assert server.visible(unique) == []
    sink.commit(f"{unique}.w.1.1")
    assert server.visible(unique) == [r.value for r in recs]
    line = next(x for x in server.committed() if x["connector"] == unique)
    assert line["manifest"]["ranges"] == [["orders", 0, 0, 4, 1], ["orders", 1, 0, 2, 1]]


def test_body_carries_the_topics_value_bytes_unchanged_and_quotes_string_values(server, make_sink, unique):
    sink = make_sink(server.url, unique)
    raw = b'{"b": 2,   "a": [1, 2.50]}'  # spacing and 2.50 would not survive a decode/encode round trip
    recs = [SinkRecord("t", 0, 0, None, json.loads(raw), raw), SinkRecord("t", 0, 1, None, "plain text", b"plain text")]
    prepare(sink, f"{unique}.w.1.1", recs)
    sink.commit(f"{unique}.w.1.1")
    text = (server.data_dir / "committed.jsonl").read_bytes()
    assert b'"records":[{"b": 2,   "a": [1, 2.50]},"plain text"]' in text


def test_commit_twice_abort_twice_and_abort_of_unknown_txn_are_ok(server, make_sink, unique):
    sink = make_sink(server.url, unique)
    recs = records("t", [{"n": 1}, {"n": 2}])
    prepare(sink, f"{unique}.w.1.1", recs)
    sink.commit(f"{unique}.w.1.1")
    sink.commit(f"{unique}.w.1.1")
    assert server.visible(unique) == [{"n": 1}, {"n": 2}]
    prepare(sink, f"{unique}.w.1.2", records("t", [{"n": 3}], start=2))
    sink.abort(f"{unique}.w.1.2")
    sink.abort(f"{unique}.w.1.2")
    sink.abort(f"{unique}.w.never")
    assert server.visible(unique) == [{"n": 1}, {"n": 2}]
    assert sink.recover() == []


def test_abort_after_commit_is_refused_as_fatal_and_the_records_stay(server, make_sink, unique):
    sink = make_sink(server.url, unique)
    prepare(sink, f"{unique}.w.1.1", records("t", [{"n": 1}]))
    sink.commit(f"{unique}.w.1.1")
    with pytest.raises(FatalError, match="already_committed"):
        sink.abort(f"{unique}.w.1.1")
    assert server.visible(unique) == [{"n": 1}]


def test_commit_of_a_txn_the_server_never_prepared_is_fatal_not_silently_ok(server, make_sink, unique):
    sink = make_sink(server.url, unique)
    with pytest.raises(FatalError, match="does not know the txn"):
        sink.commit(f"{unique}.w.9.9")


# -- crash and recovery -----------------------------------------------------------------------
def test_worker_crash_between_prepare_and_commit_new_instance_recovers_exactly_that_txn(server, make_sink, unique):
    first = make_sink(server.url, unique)
    done = records("t", [{"n": 0}])
    prepare(first, f"{unique}.w.1.1", done)
    first.commit(f"{unique}.w.1.1")
    m = prepare(first, f"{unique}.w.1.2", records("t", [{"n": 1}, {"n": 2}], start=1))
    first.close()  # the worker dies here
    second = make_sink(server.url, unique)
    assert second.recover() == [m]
    second.recover_and_commit(m)
    assert server.visible(unique) == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert second.recover() == []


def test_recover_lists_only_this_connectors_prepared_txns(server, make_sink, unique):
    mine, other = make_sink(server.url, unique), make_sink(server.url, unique + "_other")
    m = prepare(mine, f"{unique}.w.1.1", records("t", [{"n": 1}]))
    prepare(other, f"{unique}_other.w.1.1", records("t", [{"n": 1}]))
    assert mine.recover() == [m]
    other.abort(f"{unique}_other.w.1.1")
    mine.abort(m.txn_id)


def test_recover_drops_other_connectors_txns_even_if_the_server_ignores_the_query(stub, make_sink, unique):
    mine = TxnManifest(f"{unique}.w.1.1", unique, (PartitionRange("t", 0, 0, 1, 1),))
    theirs = TxnManifest("other.w.1.1", "other", (PartitionRange("t", 0, 0, 1, 1),))
    pending = [{"txn": m.txn_id, "manifest": json.loads(m.to_json())} for m in (theirs, mine)]
    st = stub((200, json.dumps({"pending": pending}), 0.0))
    assert make_sink(st.url, unique).recover() == [mine]
    assert st.requests[0][1] == f"/pending?connector={unique}"


def test_malformed_pending_answer_is_fatal_with_the_body(stub, make_sink, unique):
    st = stub((200, '{"prepared": []}', 0.0))
    with pytest.raises(FatalError, match='prepared'):
        make_sink(st.url, unique).recover()


def test_stale_epoch_prepare_is_refused_as_fenced_and_nothing_is_prepared(server, make_sink, unique):
    sink = make_sink(server.url, unique)
    prepare(sink, f"{unique}.w.2.1", records("t", [{"n": 1}]), epoch=2)
    sink.commit(f"{unique}.w.2.1")
    zombie = make_sink(server.url, unique)
    with pytest.raises(FencedError, match="epoch 1 for t-0 is older than 2"):
        prepare(zombie, f"{unique}.w.1.7", records("t", [{"n": 2}], start=1), epoch=1)
    assert zombie.recover() == []
    prepare(sink, f"{unique}.w.2.2", records("t", [{"n": 3}], start=1), epoch=2)  # the owner goes on
    sink.commit(f"{unique}.w.2.2")
    assert server.visible(unique) == [{"n": 1}, {"n": 3}]


def test_server_killed_between_prepare_and_commit_commit_succeeds_after_restart(tmp_path, make_sink, unique):
    srv = ServerProc(tmp_path).start()
    try:
        sink = make_sink(srv.url, unique, **{"http.max.retries": 20, "http.retry.backoff.ms": 50, "http.retry.backoff.max.ms": 200})
        recs = records("t", [{"n": i} for i in range(100)])
        prepare(sink, f"{unique}.w.3.1", recs, epoch=3)
        srv.kill()
        restarter = threading.Timer(0.5, srv.start)  # comes back while the commit is retrying
        restarter.start()
        sink.commit(f"{unique}.w.3.1")  # the same sink instance: its pooled connection died with the server
        restarter.join()
        assert srv.visible(unique) == [r.value for r in recs]
        assert sink.attempts > 3  # it did have to retry
        srv.kill()
        srv.start()  # the epoch fence and the committed txn survive a restart too
        sink.commit(f"{unique}.w.3.1")
        with pytest.raises(FencedError):
            prepare(sink, f"{unique}.w.2.1", records("t", [{"n": 100}], start=100), epoch=2)
        assert srv.visible(unique) == [r.value for r in recs]
    finally:
        srv.kill()


def test_server_crash_mid_log_append_leaves_txn_prepared_and_the_retry_commits_it_once(tmp_path, make_sink, unique):
    srv = ServerProc(tmp_path).start()
    try:
        sink = make_sink(srv.url, unique)
        prepare(sink, f"{unique}.w.1.1", records("t", [{"n": 1}]))
        sink.commit(f"{unique}.w.1.1")
        prepare(sink, f"{unique}.w.1.2", records("t", [{"n": 2}], start=1))
        srv.kill()
        prepared = next((tmp_path / "prepared").iterdir()).read_bytes()
        with open(tmp_path / "committed.jsonl", "ab") as log:
            log.write(prepared[: len(prepared) // 2])  # what a crash in the middle of the commit append leaves
        srv.start()
        assert [m.txn_id for m in sink.recover()] == [f"{unique}.w.1.2"]
        sink.commit(f"{unique}.w.1.2")
        assert srv.visible(unique) == [{"n": 1}, {"n": 2}]
    finally:
        srv.kill()


def test_engine_commit_failing_after_the_decision_is_committed_once_by_the_restarted_tasks_recovery(
        tmp_path, make_sink, unique):
    srv = ServerProc(tmp_path).start()
    try:
        tps = [TopicPartition("orders", 0), TopicPartition("orders", 1)]
        data = {tp: [json.dumps({"p": tp.partition, "i": i}).encode() for i in range(20)] for tp in tps}
        log = MemoryDecisionLog()
        settings = TaskSettings(commit_interval_s=0, commit_retries=1)
        sink = make_sink(srv.url, unique, _sleeps=[], **{"http.max.retries": 1})
        task = SinkTask(unique, "w1", [sink], ListSource(data), log, settings, sleep=lambda _s: None)
        task.open()
        task.assign(tps)
        sink.commit = lambda txn: (srv.kill(), HttpSink.commit(sink, txn))[1]  # the server dies at the commit
        assert task.run_cycle().outcome is CycleOutcome.FATAL and task.state is TaskState.FAILED
        srv.start()
        assert srv.visible(unique) == []
        heir = SinkTask(unique, "w2", [make_sink(srv.url, unique)], ListSource(data), log, settings, sleep=lambda _s: None)
        heir.open()
        heir.assign(tps)  # epoch bump, then recovery: the decision log names the txn -> commit
        assert heir.run_cycle().outcome is CycleOutcome.EMPTY and heir.unresolved == {}
        assert sorted((v["p"], v["i"]) for v in srv.visible(unique)) == [(p, i) for p in (0, 1) for i in range(20)]
    finally:
        srv.kill()


def test_reference_store_refuses_a_prepare_that_lands_after_its_abort(tmp_path):
    store = Store(tmp_path)
    m = TxnManifest("c.w.1.1", "c", (PartitionRange("t", 0, 0, 0, 1),))
    body = b'{"txn":"c.w.1.1","connector":"c","manifest":%s,"records":[1]}' % m.to_json().encode()
    assert store.abort("c.w.1.1") == "aborted"  # the worker gave up on a slow prepare and aborted
    with pytest.raises(Exception, match="aborted"):
        store.prepare("c.w.1.1", body)  # ... which then arrives
    assert store.pending("c") == []
    store.close()


# -- errors, retries, auth ----------------------------------------------------------------------
def test_4xx_is_fatal_with_the_response_body_and_is_not_retried(tmp_path, make_sink, unique):
    srv = ServerProc(tmp_path, token="s3cr3t-token").start()
    try:
        sink = make_sink(srv.url, unique, **{"http.auth.token": "wrong-token"})
        with pytest.raises(FatalError) as err:
            prepare(sink, f"{unique}.w.1.1", records("t", [{"n": 1}]))
        assert "HTTP 401" in str(err.value) and "missing or wrong 'Authorization: Bearer <token>'" in str(err.value)
        assert "wrong-token" not in str(err.value)
        assert sink.attempts == 1
        good = make_sink(srv.url, unique, **{"http.auth.token": "s3cr3t-token"})
        prepare(good, f"{unique}.w.1.1", records("t", [{"n": 1}]))
        good.commit(f"{unique}.w.1.1")
        assert srv.visible(unique) == [{"n": 1}]
    finally:
        srv.kill()


def test_5xx_is_retried_with_growing_backoff_then_succeeds(stub, make_sink, unique):
    st = stub((503, "busy", 0.0), (502, "bad gateway", 0.0), (500, "oops", 0.0))
    sleeps: list[float] = []
    sink = make_sink(st.url, unique, _sleeps=sleeps, **{"http.retry.backoff.ms": 100})
    prepare(sink, f"{unique}.w.1.1", records("t", [{"n": 1}]))
    assert len(st.requests) == 4
    assert len({body for _, _, body, _ in st.requests}) == 1  # the same body every time: prepare is idempotent
    assert len(sleeps) == 3 and sleeps[0] <= 0.1 < sleeps[2] <= 0.4


def test_5xx_until_retries_run_out_is_retryable_with_the_last_body(stub, make_sink, unique):
    st = stub(*[(500, f"disk full #{i}", 0.0) for i in range(10)])
    sink = make_sink(st.url, unique, _sleeps=[], **{"http.max.retries": 2})
    with pytest.raises(RetryableError, match="after 3 attempts; last: HTTP 500: disk full #2"):
        sink.commit(f"{unique}.w.1.1")
    assert len(st.requests) == 3


def test_429_honours_retry_after_and_is_retried_not_fatal(stub, make_sink, unique):
    st = stub((429, "slow down", 0.0, {"Retry-After": "3"}), (503, "later", 0.0, {"Retry-After": "3600"}))
    sleeps: list[float] = []
    sink = make_sink(st.url, unique, _sleeps=sleeps, **{"http.retry.backoff.max.ms": 5000})
    sink.commit(f"{unique}.w.1.1")
    assert len(st.requests) == 3
    assert sleeps == [3.0, 5.0]  # the server's Retry-After, capped by http.retry.backoff.max.ms


def test_read_timeout_is_retried_then_retryable(stub, make_sink, unique):
    st = stub((200, "{}", 1.0), (200, "{}", 1.0))
    sink = make_sink(st.url, unique, _sleeps=[], **{"http.timeout.ms": 150, "http.max.retries": 1})
    t0 = time.monotonic()
    with pytest.raises(RetryableError, match="ReadTimeoutError"):
        sink.abort(f"{unique}.w.1.1")
    assert len(st.requests) == 2 and time.monotonic() - t0 < 1.5


def test_server_down_is_retryable(make_sink, unique):
    sink = make_sink(f"http://127.0.0.1:{free_port()}", unique, _sleeps=[], **{"http.max.retries": 2})
    with pytest.raises(RetryableError, match="failed after 3 attempts"):
        sink.recover()


# -- config and records -------------------------------------------------------------------------
def test_secrets_are_masked_in_config_and_never_in_error_messages(stub, make_sink, unique):
    cfg = {"http.url": "http://127.0.0.1:1", "http.auth.token": "tok-123"}
    assert HttpSink.CONFIG.mask(cfg)["http.auth.token"] == MASK
    assert HttpSink.CONFIG.mask({"http.headers.authorization": "Basic Zm9vOmJhcg=="})["http.headers.authorization"] == MASK
    st = stub((400, "bad request", 0.0))
    sink = make_sink(st.url, unique, **{"http.headers.authorization": "Basic Zm9vOmJhcg=="})
    with pytest.raises(FatalError) as err:
        sink.commit(f"{unique}.w.1.1")
    assert "Zm9vOmJhcg" not in str(err.value) and "bad request" in str(err.value)
    assert st.requests[0][3]["Authorization"] == "Basic Zm9vOmJhcg=="  # sent, just never shown


def test_config_refuses_both_auth_settings_and_a_non_http_url():
    with pytest.raises(ConfigError, match="not both"):
        HttpSink("c", {"http.url": "http://x", "http.auth.token": "a", "http.headers.authorization": "b"})
    with pytest.raises(ConfigError, match="http.url"):
        HttpSink("c", {"http.url": "ftp://x"})


def test_raw_bytes_values_are_a_record_error_naming_the_record(server, make_sink, unique):
    sink = make_sink(server.url, unique)
    recs = [SinkRecord("t", 3, 41, None, b"\x00\x01", b"\x00\x01")]
    with pytest.raises(RecordError, match=r"t\[3\]@41"):
        prepare(sink, f"{unique}.w.1.1", recs)
