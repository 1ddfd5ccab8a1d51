"""The REST API against real workers (Kafka, ZooKeeper, PostgreSQL of the local stack): every endpoint,
happy path and errors, in Kafka Connect's shapes; secrets never in a response or a log line; the
OpenAPI document fuzzed by schemathesis with no 5xx.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.procs import cluster_init, wait_until
from tests.restkit import call, pg_ids, produce, start_worker

pytestmark = pytest.mark.chaos

SECRET = "s3cr3t-Pa55word-0f-the-Te5t"


@pytest.fixture
def worker(stack, unique, tmp_path):
    w = start_worker(stack, unique, "w-rest", tmp_path)
    yield w
    w.stop()


def _pg_config(stack, topic: str, table: str, **extra: str) -> dict[str, str]:
    return {"connector.class": "postgres", "topics": topic, "connection.url": stack.postgres_dsn,
            "table.name.format": table, "commit.interval.ms": "200", **extra}


def _status(worker, name: str) -> dict:
    return call(worker.url, "GET", f"/connectors/{name}/status")[1]


def _wait_task_state(worker, name: str, state: str, timeout: float = 60) -> dict:
    wait_until(lambda: (s := _status(worker, name)) and s.get("tasks") and all(t["state"] == state for t in s["tasks"]),
               timeout, f"{name}'s tasks to be {state} (now {_status(worker, name)})")
    return _status(worker, name)


# -- worker endpoints ----------------------------------------------------------------------------------
def test_root_health_ready_metrics_and_openapi_are_served_on_the_rest_port(worker):
    status, root, _ = call(worker.url, "GET", "/")
    assert status == 200 and root["version"] and root["kafka_cluster_id"], root
    assert call(worker.url, "GET", "/health")[:2] == (200, {"status": "healthy", "message": "Worker has completed startup and is "
                                                                                              "ready to handle requests."})
    assert call(worker.url, "GET", "/ready")[0] == 200
    status, text, headers = call(worker.url, "GET", "/metrics")
    assert status == 200 and "text/plain" in headers["Content-Type"] and "python_gc_objects_collected_total" in text
    status, doc, _ = call(worker.url, "GET", "/openapi.json")
    from openapi_spec_validator import validate

    validate(doc)
    assert {"/connectors", "/connectors/{name}/offsets", "/connector-plugins/{plugin}/config/validate"} <= set(doc["paths"])


def test_unknown_path_is_404_and_wrong_method_is_405_in_connect_error_shape(worker):
    status, body, _ = call(worker.url, "GET", "/no/such/thing")
    assert status == 404 and body["error_code"] == 404 and body["message"]
    status, body, headers = call(worker.url, "DELETE", "/connectors")
    assert status == 405 and body == {"error_code": 405, "message": body["message"]} and "GET, POST" in body["message"]
    assert headers["Allow"] == "GET, POST, HEAD", headers
    status, body, headers = call(worker.url, "PURGE", "/connectors")
    assert status == 405, body
    assert call(worker.url, "POST", "/connectors/x/config")[2]["Allow"] == "GET, PUT, PATCH, HEAD"
    assert call(worker.url, "GET", "/connectors/x/topics/reset")[2]["Allow"] == "PUT"
    assert call(worker.url, "DELETE", "/admin/loggers/root")[2]["Allow"] == "GET, PUT, HEAD"


# -- create, read, update, delete ------------------------------------------------------------------------
def test_create_get_list_and_a_duplicate_name_conflicts(worker, tmp_path):
    config = {"connector.class": "filesystem", "topics": "t-none", "file.path": str(tmp_path / "out")}
    status, info, headers = call(worker.url, "POST", "/connectors", {"name": "c1", "config": config})
    assert status == 201, info
    assert info == {"name": "c1", "config": {**config, "name": "c1"}, "tasks": [], "type": "sink"}
    assert headers["Location"] == "/connectors/c1"
    status, body, _ = call(worker.url, "POST", "/connectors", {"name": "c1", "config": config})
    assert (status, body["error_code"]) == (409, 409) and "c1" in body["message"]
    assert call(worker.url, "GET", "/connectors")[1] == ["c1"]
    assert call(worker.url, "GET", "/connectors/c1")[1]["name"] == "c1"
    assert call(worker.url, "GET", "/connectors/c1/config")[1] == {**config, "name": "c1"}
    expanded = call(worker.url, "GET", "/connectors?expand=status&expand=info")[1]
    assert set(expanded["c1"]) == {"status", "info"} and expanded["c1"]["status"]["type"] == "sink"
    status, info, _ = call(worker.url, "POST", "/connectors", {"name": "c2", "config": config, "initial_state": "STOPPED"})
    assert status == 201 and _status(worker, "c2")["connector"]["state"] == "STOPPED"


def test_put_config_creates_then_updates(worker, tmp_path):
    config = {"connector.class": "filesystem", "topics": "t-none", "file.path": str(tmp_path)}
    status, info, _ = call(worker.url, "PUT", "/connectors/c-put/config", config)
    assert status == 201 and info["name"] == "c-put"
    status, info, _ = call(worker.url, "PUT", "/connectors/c-put/config", {**config, "tasks.max": "3"})
    assert status == 200 and info["config"]["tasks.max"] == "3"
    assert call(worker.url, "GET", "/connectors/c-put/config")[1]["tasks.max"] == "3"


@pytest.mark.parametrize("config, key", [
    ({"connector.class": "filesystem", "file.path": "/tmp"}, "topics"),
    ({"connector.class": "filesystem", "topics": "t", "file.path": "/tmp", "tasks.max": "many"}, "tasks.max"),
    ({"connector.class": "nope", "topics": "t"}, "connector.class"),
    ({"connector.class": "filesystem", "topics": "t"}, "file.path"),
    ({"connector.class": "filesystem", "topics": "t", "file.path": "/tmp", "errors.tolerance": "all"},
     "errors.deadletterqueue.topic.name"),
    ({"connector.class": "filesystem", "topics": "t", "file.path": "/tmp", "errors.tolerance": "some"}, "errors.tolerance"),
    ({"connector.class": "postgres", "topics": "t", "connection.url": "postgresql://h/db", "insert.mode": "upsert"}, "pk.mode"),
    ({"connector.class": "filesystem", "topics": "t", "file.path": {"nested": 1}}, "file.path"),
])
def test_invalid_config_is_rejected_with_400_naming_the_key(worker, config, key):
    for method, path, body in (("POST", "/connectors", {"name": "bad", "config": config}),
                               ("PUT", "/connectors/bad/config", config)):
        status, err, _ = call(worker.url, method, path, body)
        assert status == 400 and err["error_code"] == 400, err
        assert key in err["message"], err["message"]
    assert call(worker.url, "GET", "/connectors/bad")[0] == 404, "an invalid config was stored"


def test_malformed_requests_are_400_not_500(worker):
    assert call(worker.url, "POST", "/connectors", raw=b"{not json")[0] == 400
    assert call(worker.url, "POST", "/connectors", raw=b"")[0] == 400
    assert call(worker.url, "POST", "/connectors", [1, 2])[0] == 400
    assert call(worker.url, "POST", "/connectors", {"name": "x"})[0] == 400
    assert call(worker.url, "POST", "/connectors", {"name": "a/b", "config": {}})[0] == 400
    assert call(worker.url, "POST", "/connectors", raw=b'{"name": "x", "config": {"a": NaN}}')[0] == 400
    assert call(worker.url, "PUT", "/connectors/x/config", {"name": "y", "connector.class": "memory", "topics": "t"})[0] == 400
    assert call(worker.url, "POST", "/connectors", {"name": "x", "config": {"connector.class": "memory", "topics": "t"},
                                                    "initial_state": "SLEEPING"})[0] == 400
    assert call(worker.url, "POST", "/connectors", {"name": "m", "config": {"connector.class": "memory", "topics": "t"},
                                                    "initial_state": "STOPPED"})[0] == 201
    status, body, _ = call(worker.url, "POST", "/connectors/m/restart?includeTasks=maybe")
    assert status == 400 and "includeTasks" in body["message"]
    assert call(worker.url, "GET", "/connectors/m/tasks/zero/status")[0] == 404
    assert call(worker.url, "POST", "/connectors", raw=b"{" * 5000 + b"}" * 5000)[0] == 400, "deep nesting"
    import socket

    with socket.create_connection(("127.0.0.1", worker.rest_port), timeout=10) as sock:
        sock.sendall(b"POST /connectors HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 413"), "an oversized body is refused before it is read"


def test_every_connector_path_answers_404_for_an_unknown_connector(worker):
    for method, suffix in (("GET", ""), ("DELETE", ""), ("GET", "/config"), ("GET", "/status"), ("GET", "/tasks"),
                           ("GET", "/tasks/0/status"), ("POST", "/tasks/0/restart"), ("PUT", "/pause"), ("PUT", "/resume"),
                           ("PUT", "/stop"), ("POST", "/restart"), ("GET", "/topics"), ("PUT", "/topics/reset"),
                           ("GET", "/offsets"), ("DELETE", "/offsets"), ("GET", "/transactions")):
        status, body, _ = call(worker.url, method, f"/connectors/ghost{suffix}")
        assert (status, body["error_code"]) == (404, 404), (method, suffix, body)
        assert body["message"] == "Connector ghost not found"
    body = {"offsets": [{"partition": {"kafka_topic": "t", "kafka_partition": 0}, "offset": {"kafka_offset": 1}}]}
    assert call(worker.url, "PATCH", "/connectors/ghost/offsets", body)[0] == 404
    assert call(worker.url, "PATCH", "/connectors/ghost/config", {"tasks.max": "1"})[0] == 404


# -- a delivering connector: status, tasks, topics, offsets, pause/resume, stop, delete ----------------------------
def test_status_tasks_topics_and_offsets_of_a_delivering_connector_agree_with_postgres(worker, stack, make_topic, unique, pg):
    topic = make_topic(3)
    name = unique  # connector names are unique per test: txn ids are unique only within a cluster
    assert call(worker.url, "POST", "/connectors", {"name": name, "config": _pg_config(stack, topic, unique)})[0] == 201
    produce(stack.kafka_bootstrap, topic, [(i % 3, json.dumps({"id": f"r{i}"}).encode()) for i in range(90)])
    wait_until(lambda: len(pg_ids(pg, unique)) >= 90, 60, "90 rows")
    status = _wait_task_state(worker, name, "RUNNING")
    from eosink.worker.version import VERSION

    assert status["connector"] == {"state": "RUNNING", "worker_id": "w-rest", "version": VERSION}
    task = status["tasks"][0]
    assert (task["id"], task["worker_id"]) == (0, "w-rest") and "trace" not in task
    assert sorted(p["partition"] for p in task["partitions"]) == [f"{topic}-{p}" for p in range(3)]
    assert all(p["epoch"] >= 1 for p in task["partitions"])
    wait_until(lambda: sum(p["delivered"] for p in _status(worker, name)["tasks"][0]["partitions"]) == 90, 30,
               "delivered counts in the status")
    assert call(worker.url, "GET", f"/connectors/{name}/tasks/0/status")[1]["state"] == "RUNNING"
    assert call(worker.url, "GET", f"/connectors/{name}/tasks/7/status")[0] == 404
    tasks = call(worker.url, "GET", f"/connectors/{name}/tasks")[1]
    assert tasks[0]["id"] == {"connector": name, "task": 0} and tasks[0]["config"]["topics"] == topic
    assert call(worker.url, "GET", f"/connectors/{name}/topics")[1] == {name: {"topics": [topic]}}
    assert call(worker.url, "GET", f"/connectors/{name}")[1]["tasks"] == [{"connector": name, "task": 0}]
    # offsets: the decision log, which agrees with the rows delivered and with the sink's own bookkeeping
    offsets = call(worker.url, "GET", f"/connectors/{name}/offsets")[1]["offsets"]
    api = {(o["partition"]["kafka_topic"], o["partition"]["kafka_partition"]): o["offset"]["kafka_offset"] for o in offsets}
    rows = dict(((topic, p), n + 1) for p, n in pg.execute(f'SELECT __partition, max(__offset) FROM "{unique}" GROUP BY 1'))
    sink = {(t, p): n for t, p, n in pg.execute(
        "SELECT topic, partition, next_offset FROM eosink_offsets WHERE connector = %s", (name,))}
    assert api == rows == sink, (api, rows, sink)


def test_pause_keeps_the_partitions_and_stops_delivery_until_resume(worker, stack, make_topic, unique, pg):
    topic = make_topic(2)
    name = unique  # connector names are unique per test: txn ids are unique only within a cluster
    call(worker.url, "POST", "/connectors", {"name": name, "config": _pg_config(stack, topic, unique)})
    produce(stack.kafka_bootstrap, topic, [(i % 2, json.dumps({"id": f"a{i}"}).encode()) for i in range(20)])
    wait_until(lambda: len(pg_ids(pg, unique)) == 20, 60, "first 20 rows")
    epochs = {p["partition"]: p["epoch"] for p in _wait_task_state(worker, name, "RUNNING")["tasks"][0]["partitions"]}
    assert call(worker.url, "PUT", f"/connectors/{name}/pause")[0] == 202
    status = _wait_task_state(worker, name, "PAUSED")
    assert status["connector"]["state"] == "PAUSED"
    produce(stack.kafka_bootstrap, topic, [(i % 2, json.dumps({"id": f"b{i}"}).encode()) for i in range(20)])
    wait_until(lambda: sum(p["lag"] or 0 for p in _status(worker, name)["tasks"][0]["partitions"]) >= 20, 30,
               "the lag of the paused task to show the new records")
    assert len(pg_ids(pg, unique)) == 20, "a paused connector delivered"
    assert call(worker.url, "PUT", f"/connectors/{name}/resume")[0] == 202
    wait_until(lambda: len(pg_ids(pg, unique)) == 40, 60, "delivery after resume")
    after = {p["partition"]: p["epoch"] for p in _wait_task_state(worker, name, "RUNNING")["tasks"][0]["partitions"]}
    assert after == epochs, "pause/resume re-acquired the partitions (a real pause keeps them)"


def test_offsets_change_only_while_stopped_and_a_rewind_redelivers_from_there(worker, stack, make_topic, unique, pg, zk):
    topic = make_topic(1)
    name = unique  # connector names are unique per test: txn ids are unique only within a cluster
    call(worker.url, "POST", "/connectors", {"name": name, "config": _pg_config(stack, topic, unique)})
    produce(stack.kafka_bootstrap, topic, [(0, json.dumps({"id": f"r{i}"}).encode()) for i in range(30)])
    wait_until(lambda: len(pg_ids(pg, unique)) == 30, 60, "30 rows")
    patch = {"offsets": [{"partition": {"kafka_topic": topic, "kafka_partition": 0}, "offset": {"kafka_offset": 20}}]}
    status, body, _ = call(worker.url, "PATCH", f"/connectors/{name}/offsets", patch)
    assert status == 400 and "STOPPED" in body["message"]
    assert call(worker.url, "DELETE", f"/connectors/{name}/offsets")[0] == 400
    assert call(worker.url, "PUT", f"/connectors/{name}/stop")[0] == 204  # Connect's code for a stop
    wait_until(lambda: _status(worker, name)["tasks"] == [], 30, "tasks to stop")
    assert _status(worker, name)["connector"]["state"] == "STOPPED"
    path = f"/eosink/{unique}/partitions/{name}/{topic}-0"
    before = json.loads(zk.get(path)[0])
    for bad in ({"offsets": []}, {"offsets": [{"partition": {"kafka_topic": topic}, "offset": {"kafka_offset": 1}}]},
                {"offsets": [{"partition": {"kafka_topic": topic, "kafka_partition": 0}, "offset": {"kafka_offset": -1}}]},
                {"offsets": [{"partition": {"kafka_topic": "no\u0000way", "kafka_partition": 0}, "offset": None}]}, []):
        assert call(worker.url, "PATCH", f"/connectors/{name}/offsets", bad)[0] == 400, bad
    status, body, _ = call(worker.url, "PATCH", f"/connectors/{name}/offsets", patch)
    assert (status, body) == (200, {"message": "The offsets for this connector have been altered successfully"})
    after = json.loads(zk.get(path)[0])
    assert after["next_offset"] == 20 and after["epoch"] == before["epoch"] + 1, "the alteration must fence older owners"
    assert after["txn"] == before["txn"], "a decided txn must stay decided"
    assert call(worker.url, "GET", f"/connectors/{name}/offsets")[1]["offsets"][0]["offset"] == {"kafka_offset": 20}
    assert call(worker.url, "PUT", f"/connectors/{name}/resume")[0] == 202
    # the records at offsets 20..29 of the (transactional) topic are delivered again: exactly those, once more
    wait_until(lambda: len(pg_ids(pg, unique)) == 40, 60, "redelivery from offset 20")
    time.sleep(1)
    counts = Counter(pg_ids(pg, unique))
    again = sorted(r for r, n in counts.items() if n == 2)
    assert set(counts.values()) == {1, 2}, counts
    assert again == sorted(f"r{i}" for i in range(20, 30)), again
    # reset: back to consumer.auto.offset.reset (earliest)
    call(worker.url, "PUT", f"/connectors/{name}/stop")
    wait_until(lambda: _status(worker, name)["tasks"] == [], 30, "tasks to stop")
    assert call(worker.url, "DELETE", f"/connectors/{name}/offsets")[1] == {
        "message": "The offsets for this connector have been reset successfully"}
    assert call(worker.url, "GET", f"/connectors/{name}/offsets")[1] == {"offsets": []}


def test_delete_stops_the_tasks_and_a_recreated_connector_resumes_without_duplicates(worker, stack, make_topic, unique, pg):
    topic = make_topic(1)
    name = unique  # connector names are unique per test: txn ids are unique only within a cluster
    config = _pg_config(stack, topic, unique)
    call(worker.url, "POST", "/connectors", {"name": name, "config": config})
    produce(stack.kafka_bootstrap, topic, [(0, json.dumps({"id": f"r{i}"}).encode()) for i in range(10)])
    wait_until(lambda: len(pg_ids(pg, unique)) == 10, 60, "10 rows")
    assert call(worker.url, "DELETE", f"/connectors/{name}")[0] == 204
    assert call(worker.url, "GET", f"/connectors/{name}")[0] == 404
    produce(stack.kafka_bootstrap, topic, [(0, json.dumps({"id": f"s{i}"}).encode()) for i in range(10)])
    time.sleep(2.5)
    assert len(pg_ids(pg, unique)) == 10, "a deleted connector delivered"
    call(worker.url, "POST", "/connectors", {"name": name, "config": config})
    wait_until(lambda: len(pg_ids(pg, unique)) >= 20, 60, "20 rows")
    time.sleep(1)
    ids = pg_ids(pg, unique)
    assert len(ids) == len(set(ids)) == 20


def test_patch_config_merges_the_keys_removes_null_ones_and_rejects_what_put_rejects(worker, tmp_path):
    config = {"connector.class": "filesystem", "topics": "t-none", "file.path": str(tmp_path), "tasks.max": "2"}
    assert call(worker.url, "POST", "/connectors", {"name": "c-patch", "config": config, "initial_state": "STOPPED"})[0] == 201
    status, info, _ = call(worker.url, "PATCH", "/connectors/c-patch/config", {"topics": "t-other", "tasks.max": None})
    assert status == 200 and info["name"] == "c-patch" and info["type"] == "sink", info
    expected = {"connector.class": "filesystem", "topics": "t-other", "file.path": str(tmp_path), "name": "c-patch"}
    assert info["config"] == expected
    assert call(worker.url, "GET", "/connectors/c-patch/config")[1] == expected
    for bad, key in (({"tasks.max": "many"}, "tasks.max"), ({"topics": None}, "topics"), ({"name": "other"}, "name"),
                     ({"file.path": {"nested": 1}}, "file.path")):
        status, err, _ = call(worker.url, "PATCH", "/connectors/c-patch/config", bad)
        assert status == 400 and key in err["message"], (bad, err)
    assert call(worker.url, "PATCH", "/connectors/c-patch/config", ["topics"])[0] == 400
    assert call(worker.url, "GET", "/connectors/c-patch/config")[1] == expected, "a rejected patch was stored"


def test_stop_is_204_and_statuses_carry_the_plugin_version_as_connect_4(worker, stack, make_topic, unique, pg):
    from eosink.worker.version import VERSION

    topic = make_topic(1)
    name = unique
    call(worker.url, "POST", "/connectors", {"name": name, "config": _pg_config(stack, topic, unique)})
    status = _wait_task_state(worker, name, "RUNNING")
    assert status["connector"]["version"] == VERSION and [t["version"] for t in status["tasks"]] == [VERSION]
    assert call(worker.url, "GET", f"/connectors/{name}/tasks/0/status")[1]["version"] == VERSION
    expanded = call(worker.url, "GET", "/connectors?expand=status")[1][name]["status"]
    assert expanded["tasks"][0]["version"] == VERSION
    assert call(worker.url, "PUT", f"/connectors/{name}/pause")[0] == 202
    assert call(worker.url, "PUT", f"/connectors/{name}/stop")[:2] == (204, None)
    wait_until(lambda: _status(worker, name)["tasks"] == [], 30, "tasks to stop")


def test_topics_reset_empties_the_active_topics_until_the_connector_delivers_from_one_again(worker, stack, make_topic,
                                                                                           unique, pg):
    first, second = make_topic(1), make_topic(1)
    name = unique
    call(worker.url, "POST", "/connectors", {"name": name, "config": _pg_config(stack, f"{first},{second}", unique)})
    produce(stack.kafka_bootstrap, first, [(0, b'{"id": "a0"}')])
    produce(stack.kafka_bootstrap, second, [(0, b'{"id": "b0"}')])
    wait_until(lambda: sorted(pg_ids(pg, unique)) == ["a0", "b0"], 60, "a0 and b0 delivered")  # decided before visible
    assert call(worker.url, "GET", f"/connectors/{name}/topics")[1][name]["topics"] == sorted([first, second])
    assert call(worker.url, "PUT", f"/connectors/{name}/topics/reset")[:2] == (202, None)
    assert call(worker.url, "GET", f"/connectors/{name}/topics")[1] == {name: {"topics": []}}
    produce(stack.kafka_bootstrap, second, [(0, b'{"id": "b1"}')])
    wait_until(lambda: call(worker.url, "GET", f"/connectors/{name}/topics")[1][name]["topics"] == [second], 60,
               "the topic delivered from after the reset to be active again (and only it)")
    assert sorted(pg_ids(pg, unique)) == ["a0", "b0", "b1"]


def test_admin_loggers_change_what_the_worker_really_logs(worker, tmp_path):
    loggers = call(worker.url, "GET", "/admin/loggers")[1]
    assert loggers["root"]["level"] and loggers["eosink"] == {"level": "INFO", "last_modified": None}, loggers
    assert loggers["eosink.worker.control.rest"]["level"] == "INFO"
    assert call(worker.url, "GET", "/admin/loggers/no.such.logger")[0] == 404
    call(worker.url, "GET", "/connectors/probe-before")
    assert "probe-before" not in worker.log_text(), "GET requests are logged at DEBUG only"
    status, changed, _ = call(worker.url, "PUT", "/admin/loggers/eosink.worker.control", {"level": "DEBUG"})
    assert status == 200 and "eosink.worker.control.rest" in changed and "eosink.worker.engine.task" not in changed, changed
    got = call(worker.url, "GET", "/admin/loggers/eosink.worker.control.rest")[1]
    assert got["level"] == "DEBUG" and got["last_modified"] > 0, got
    call(worker.url, "GET", "/connectors/probe-after")
    wait_until(lambda: "probe-after" in worker.log_text(), 10, "a DEBUG rest_request line once the level is DEBUG")
    # a child set higher than its parent: the INFO lines of that logger go, its parent's stay DEBUG
    assert call(worker.url, "PUT", "/admin/loggers/eosink.worker.control.rest", {"level": "ERROR"})[0] == 200
    config = {"connector.class": "filesystem", "topics": "t-none", "file.path": str(tmp_path)}
    assert call(worker.url, "POST", "/connectors", {"name": "quiet", "config": config})[0] == 201
    assert call(worker.url, "GET", "/admin/loggers/eosink.worker.control")[1]["level"] == "DEBUG"
    time.sleep(0.5)
    assert "connector_created" not in worker.log_text(), "an INFO line of a logger set to ERROR was written"
    for query, body, words in (("?scope=cluster", {"level": "INFO"}, "scope=cluster is not supported"),
                               ("?scope=galaxy", {"level": "INFO"}, "scope"), ("", {"level": "LOUD"}, "LOUD"),
                               ("", {}, "'level'")):
        status, err, _ = call(worker.url, "PUT", f"/admin/loggers/eosink{query}", body)
        assert status == 400 and words in err["message"], (query, body, err)
    assert call(worker.url, "PUT", "/admin/loggers/eosink?scope=worker", {"level": "warn"})[0] == 200
    assert call(worker.url, "GET", "/admin/loggers/eosink.worker.control.rest")[1]["level"] == "WARN"


# -- failures, restart -------------------------------------------------------------------------------------------
def test_failed_task_shows_its_trace_and_restart_only_failed_restarts_it(worker, stack, make_topic, unique, pg):
    topic = make_topic(1)
    name = unique  # connector names are unique per test: txn ids are unique only within a cluster
    call(worker.url, "POST", "/connectors", {"name": name, "config": _pg_config(stack, topic, unique)})
    produce(stack.kafka_bootstrap, topic, [(0, b'{"id": "ok-0"}'), (0, b"{not json"), (0, b'{"id": "ok-2"}')])
    status = _wait_task_state(worker, name, "FAILED")
    assert status["connector"]["state"] == "FAILED"
    trace = status["tasks"][0]["trace"]
    assert f"{topic}[0]@1" in trace and "decoded" in trace, trace
    assert pg_ids(pg, unique) == ["ok-0"], "everything before the bad record is delivered, nothing after"
    epoch = status["tasks"][0]["partitions"][0]["epoch"]
    status, body, _ = call(worker.url, "POST", f"/connectors/{name}/restart?includeTasks=true&onlyFailed=true")
    assert status == 202 and body["tasks"][0]["state"] == "RESTARTING" and body["connector"]["state"] == "FAILED"
    # the restarted task re-acquires its partition (a new epoch) and meets the same record again
    wait_until(lambda: (t := _status(worker, name)["tasks"]) and t[0]["state"] == "FAILED"
               and t[0]["partitions"] and t[0]["partitions"][0]["epoch"] > epoch, 60, "the task restarted")
    assert call(worker.url, "POST", f"/connectors/{name}/restart")[0] == 204
    assert call(worker.url, "POST", f"/connectors/{name}/tasks/0/restart")[0] == 204
    assert call(worker.url, "POST", f"/connectors/{name}/tasks/9/restart")[0] == 404
    # the operator's fix: tolerate bad records into a dead-letter topic -> the rest is delivered
    fixed = {**_pg_config(stack, topic, unique), "errors.tolerance": "all", "errors.deadletterqueue.topic.name": f"{topic}-dlq"}
    assert call(worker.url, "PUT", f"/connectors/{name}/config", fixed)[0] == 200
    wait_until(lambda: sorted(pg_ids(pg, unique)) == ["ok-0", "ok-2"], 60, "delivery past the bad record")
    status, body, _ = call(worker.url, "POST", f"/connectors/{name}/restart?onlyFailed=true")
    assert status == 202 and all(t["state"] != "RESTARTING" for t in body["tasks"]), "only FAILED tasks restart"


def test_in_doubt_endpoint_lists_a_decided_uncommitted_txn_until_recovery_commits_it(stack, make_topic, unique, pg, tmp_path):
    """The runbook's fatal case: decided in ZooKeeper, not committed in PostgreSQL (the worker died)."""
    from eosink.worker.control.store import ConnectorStore
    from eosink.worker.engine.zk import ZkSession
    from tests.procs import WorkerProcess, register

    topic = make_topic(1)
    name = unique  # connector names are unique per test: txn ids are unique only within a cluster
    register(stack.zookeeper_hosts, unique, name, _pg_config(stack, topic, unique, **{"batch.max.records": "10"}))
    produce(stack.kafka_bootstrap, topic, [(0, json.dumps({"id": f"r{i}"}).encode()) for i in range(40)])
    dying = WorkerProcess(stack, unique, "w-dies", tmp_path, fault="after_decide:2")
    assert dying.wait(90) == -9, dying.log_text()[-2000:]
    session = ZkSession(stack.zookeeper_hosts, unique).start()
    try:
        ConnectorStore(session).set_target_state(name, "STOPPED")  # nobody recovers it while we look
    finally:
        session.stop()
    w = start_worker(stack, unique, "w-looks", tmp_path)
    try:
        body = call(w.url, "GET", f"/connectors/{name}/transactions")[1]
        decided = [t for t in body["transactions"] if t["state"] == "DECIDED"]
        assert len(decided) == 1 and decided[0]["sinks"] == ["PostgresSink"], body
        assert decided[0]["partitions"] == [f"{topic}-0"]
        assert len(pg_ids(pg, unique)) == 10, "only the first cycle is visible"
        assert call(w.url, "PUT", f"/connectors/{name}/resume")[0] == 202
        wait_until(lambda: len(pg_ids(pg, unique)) == 40, 60, "recovery and the rest")
        assert call(w.url, "GET", f"/connectors/{name}/transactions")[1]["transactions"] == []
        ids = pg_ids(pg, unique)
        assert len(set(ids)) == len(ids) == 40
    finally:
        w.stop()


# -- plugins and validation ----------------------------------------------------------------------------------------
def test_connector_plugins_config_and_validate(worker):
    plugins = call(worker.url, "GET", "/connector-plugins")[1]
    classes = {p["class"] for p in plugins}
    assert {"eosink.connectors.postgres.sink.PostgresSink", "eosink.connectors.filesystem.FilesystemSink", "fanout"} <= classes
    assert all(p["type"] == "sink" for p in plugins)
    keys = {k["name"]: k for k in call(worker.url, "GET", "/connector-plugins/postgres/config")[1]}
    assert keys["connection.url"]["required"] and keys["connection.password"]["type"] == "PASSWORD"
    assert "errors.tolerance" in keys and keys["errors.tolerance"]["default_value"] == "none"
    status, infos, _ = call(worker.url, "PUT", "/connector-plugins/PostgresSink/config/validate",
                            {"name": "v", "topics": "t", "tasks.max": "x", "connection.password": SECRET})
    assert status == 200 and infos["name"] == "eosink.connectors.postgres.sink.PostgresSink"
    errors = {c["value"]["name"]: c["value"]["errors"] for c in infos["configs"] if c["value"]["errors"]}
    assert set(errors) == {"tasks.max", "connection.url"} and infos["error_count"] == 2, errors
    shown = {c["value"]["name"]: c["value"]["value"] for c in infos["configs"]}
    assert shown["connection.password"] == "[hidden]" and shown["connector.class"] == "postgres"
    ok = call(worker.url, "PUT", "/connector-plugins/postgres/config/validate",
              {"name": "v", "topics": "t", "connection.url": "${env:SOME_DSN}"})[1]
    assert ok["error_count"] == 0, ok
    assert call(worker.url, "PUT", "/connector-plugins/postgres/config/validate", {"connector.class": "filesystem"})[0] == 400
    assert call(worker.url, "PUT", "/connector-plugins/nope/config/validate", {})[0] == 404
    assert call(worker.url, "GET", "/connector-plugins/nope/config")[0] == 404
    fan = call(worker.url, "PUT", "/connector-plugins/fanout/config/validate",
               {"name": "f", "topics": "t", "sinks": "db", "sinks.db.connector.class": "postgres"})[1]
    assert [c["value"]["name"] for c in fan["configs"] if c["value"]["errors"]] == ["sinks.db.connection.url"]


# -- secrets -----------------------------------------------------------------------------------------------------
def test_secrets_never_appear_in_responses_or_in_the_worker_log(stack, unique, tmp_path, make_topic):
    topic = make_topic(1)
    props = tmp_path / "worker-secrets.properties"  # worker-level credentials through the providers, never on the command line
    props.write_text(f"kafka.password={SECRET}-kafka\n")
    # the open stack's ZooKeeper has no SASL users: the digest scheme, and the root made first, as an operator does
    zk = {"EOSINK_ZOOKEEPER_USER": f"{unique}-zk", "EOSINK_ZOOKEEPER_PASSWORD": SECRET + "-zk", "EOSINK_ZOOKEEPER_AUTH_SCHEME": "digest"}
    init = cluster_init(unique, zk)
    assert init.returncode == 0, init.stderr
    w = start_worker(stack, unique, "w-secret", tmp_path, extra_env={"TEST_PG_PASSWORD": SECRET + "-env", **zk},
                     extra_args=["--kafka-property", f"sasl.password=${{file:{props}:kafka.password}}"])
    try:
        # one password given literally, one through ${env:} (resolved at the worker); and a connector that
        # fails to start with an error quoting its (nonsense) DSN, which is the secret too
        good = {"connector.class": "postgres", "topics": topic, "connection.url": stack.postgres_dsn, "table.name.format": unique,
                "connection.password": SECRET, "consumer.override.sasl.password": SECRET}
        env = {**good, "connection.password": "${env:TEST_PG_PASSWORD}", "table.name.format": unique + "_env"}
        leaky = {"connector.class": "postgres", "topics": topic, "connection.url": SECRET, "connection.password": SECRET}
        responses = [call(w.url, "POST", "/connectors", {"name": n, "config": c})
                     for n, c in ((f"{unique}-good", good), (f"{unique}-env", env), (f"{unique}-leaky", leaky))]
        assert [r[0] for r in responses] == [201, 201, 201], responses
        produce(stack.kafka_bootstrap, topic, [(0, b'{"id": "x"}')])
        g, e, leak = f"/connectors/{unique}-good", f"/connectors/{unique}-env", f"/connectors/{unique}-leaky"
        wait_until(lambda: call(w.url, "GET", f"{leak}/status")[1]["connector"]["state"] == "FAILED", 60,
                   "the leaky connector to fail")
        _wait_task_state(w, f"{unique}-good", "RUNNING")
        for path in ("/connectors?expand=info&expand=status", g, f"{g}/config", f"{g}/tasks", f"{e}/config", f"{leak}/status",
                     f"{leak}/tasks", leak, f"{g}/transactions", f"{leak}/transactions", f"{g}/status"):
            responses.append(call(w.url, "GET", path))
        responses.append(call(w.url, "PUT", "/connector-plugins/postgres/config/validate", {**good, "name": "good"}))
        responses.append(call(w.url, "PUT", f"{g}/config", good))
        responses.append(call(w.url, "GET", "/metrics"))
        status = call(w.url, "GET", f"{leak}/status")[1]
        assert "[hidden]" in json.dumps(status), status  # the trace quoted it, redacted
        for r in responses:
            assert SECRET not in json.dumps(r[1]), r
        assert SECRET not in Path(f"/proc/{w.proc.pid}/cmdline").read_text(), "a secret on the worker's command line"
        assert call(w.url, "GET", f"{g}/config")[1]["connection.password"] == "[hidden]"
        assert call(w.url, "GET", f"{e}/config")[1]["connection.password"] == "[hidden]"
    finally:
        w.stop()
    log = w.log_path.read_text()
    assert "connector_started" in log and SECRET not in log, "a secret reached the worker log"


# -- authentication -------------------------------------------------------------------------------------------
def test_rest_requires_basic_or_bearer_credentials_when_configured(stack, unique, tmp_path):
    w = start_worker(stack, unique, "w-auth", tmp_path, extra_args=["--rest-basic-auth", "admin:pw-123", "--rest-token", "tok-456"])
    try:
        status, body, headers = call(w.url, "GET", "/connectors")
        assert status == 401 and body["error_code"] == 401 and headers["WWW-Authenticate"].startswith("Basic")
        basic = "Basic " + base64.b64encode(b"admin:pw-123").decode()
        assert call(w.url, "GET", "/connectors", headers={"Authorization": basic})[0] == 200
        assert call(w.url, "GET", "/connectors", headers={"Authorization": "Bearer tok-456"})[0] == 200
        for wrong in ("Bearer nope", "Basic " + base64.b64encode(b"admin:nope").decode(), "Basic !!!", "Digest x"):
            assert call(w.url, "GET", "/connectors", headers={"Authorization": wrong})[0] == 401, wrong
        assert call(w.url, "GET", "/health")[0] == 200 and call(w.url, "GET", "/ready")[0] == 200, "probes stay open"
    finally:
        w.stop()
    log = w.log_path.read_text()
    assert "rest_listening" in log and "pw-123" not in log and "tok-456" not in log


# -- the OpenAPI document, fuzzed -------------------------------------------------------------------------------
def test_schemathesis_finds_no_server_error_for_any_generated_input(worker, tmp_path):
    """Two bounded runs (< 60 s together): any connector name (mostly 404s), then every operation
    on one existing connector (STOPPED, so generated offsets may be written; never deleted)."""
    config = {"connector.class": "filesystem", "topics": "fuzz-none", "file.path": str(tmp_path / "out")}
    assert call(worker.url, "POST", "/connectors", {"name": "fuzz", "config": config, "initial_state": "STOPPED"})[0] == 201
    (tmp_path / "existing").mkdir()
    (tmp_path / "existing" / "schemathesis.toml").write_text('[parameters]\n"path.name" = "fuzz"\n')
    base = [os.path.join(os.path.dirname(sys.executable), "schemathesis"), "run", f"{worker.url}/openapi.json",
            "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            "--max-examples", "10", "--phases", "examples,coverage,fuzzing", "--workers", "2", "--seed", "7",
            "--max-time", "20", "--request-timeout", "10", "--suppress-health-check", "all", "--no-color",
            "--generation-database", "none"]
    started = time.monotonic()
    for cwd, extra in ((tmp_path, []), (tmp_path / "existing", ["--exclude-name", "DELETE /connectors/{name}"])):
        r = subprocess.run(base + extra, capture_output=True, text=True, timeout=120, cwd=cwd)
        assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
        assert " passed" in r.stdout and "generated" in r.stdout, r.stdout[-2000:]
    assert time.monotonic() - started < 60
    assert call(worker.url, "GET", "/connectors/fuzz")[0] == 200
    assert "rest_failed" not in worker.log_text(), worker.log_text()[-3000:]
