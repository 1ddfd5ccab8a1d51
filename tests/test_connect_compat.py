"""eosink's REST API beside the real Kafka Connect 4: the same calls, compared call by call.

A distributed Kafka Connect worker (``ConnectDistributed``, jars from ``worker/stack/jvm/connect/pom.xml``,
its config/offset/status topics and group unique to the run, in the shared Kafka) and an eosink
worker each get an equivalent file sink connector (Connect's ``FileStreamSinkConnector``, eosink's
``filesystem``); then the whole API is walked on both, and each call's status code and JSON key
sets (not values) are compared. Where eosink differs on purpose, :data:`INTENDED` lists the
difference with its reason; any other difference - or an intended one that went away - fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.procs import free_port, wait_until
from tests.restkit import call, start_worker

pytestmark = pytest.mark.connect

CONNECT_CLASS = "org.apache.kafka.connect.file.FileStreamSinkConnector"
NAME = "compat"

#: label -> the differences eosink has on purpose (as :func:`differences` words them), each with why.
INTENDED: dict[str, dict[str, str]] = {
    "GET /": {
        "$ keys: eosink adds ['eosink_cluster', 'worker_id']": "which eosink cluster and worker answered",
    },
    "GET /connectors?expand=status&expand=info": {
        "$.*.status.tasks[] keys: eosink adds ['partitions']": "per-partition epoch, lag and delivered counts",
    },
    "GET /connectors/{n}/status": {
        "$.tasks[] keys: eosink adds ['partitions']": "per-partition epoch, lag and delivered counts",
    },
    "GET /connectors/{n}/tasks/0/status": {
        "$ keys: eosink adds ['partitions']": "per-partition epoch, lag and delivered counts",
    },
    "POST /connectors/{n}/restart?includeTasks=true&onlyFailed=false": {
        "$.tasks[] keys: eosink adds ['eosink_state', 'partitions']":
            "per-partition epoch, lag and delivered counts; eosink's own task state while it differs (RESTARTING)",
    },
    "POST /connectors/{n}/restart?includeTasks=true&onlyFailed=true": {
        "$.tasks[] keys: eosink adds ['partitions']": "per-partition epoch, lag and delivered counts",
    },
    "PUT /connectors/ghost/topics/reset (404)": {
        "status: connect 202, eosink 404": "every connector path answers 404 for an unknown connector; Connect accepts "
                                           "a reset of any name",
    },
    "DELETE /connectors (405)": {
        "header Allow: eosink sends it": "RFC 9110 asks a 405 to list the allowed methods; Connect's Jersey sends none",
    },
    "PUT /admin/loggers/{logger} (bad level)": {
        "status: connect 404, eosink 400": "an unknown level is a bad request; Connect answers 404",
    },
    "PUT /admin/loggers/{logger}?scope=cluster": {
        "status: connect 204, eosink 400": "levels are set per worker: eosink refuses scope=cluster, naming it",
    },
}


# -- the two workers ---------------------------------------------------------------------------------------------
def _start_connect(stack, workdir: Path, request) -> str:
    from confluent_kafka.admin import AdminClient

    from eosink.worker.stack import jvm

    jars = jvm.resolve_jars("connect", "kafka-connect")
    java = jvm.java("kafka-connect")
    run = f"eosink-compat-{uuid.uuid4().hex[:8]}"
    topics = [f"{run}-config", f"{run}-offsets", f"{run}-status"]
    port = free_port()
    (workdir / "log4j2.properties").write_text(
        "status = warn\nappender.file.type = File\nappender.file.name = file\n"
        f"appender.file.fileName = {workdir / 'connect.log'}\n"
        "appender.file.layout.type = PatternLayout\nappender.file.layout.pattern = [%d] %p %m (%c)%n\n"
        "rootLogger.level = info\nrootLogger.appenderRef.file.ref = file\n")
    (workdir / "worker.properties").write_text("\n".join([
        f"bootstrap.servers={stack.kafka_bootstrap}", f"group.id={run}",
        f"config.storage.topic={topics[0]}", f"offset.storage.topic={topics[1]}", f"status.storage.topic={topics[2]}",
        "config.storage.replication.factor=1", "offset.storage.replication.factor=1", "status.storage.replication.factor=1",
        "offset.storage.partitions=1", "status.storage.partitions=1",
        "key.converter=org.apache.kafka.connect.storage.StringConverter",
        "value.converter=org.apache.kafka.connect.storage.StringConverter",
        f"listeners=http://127.0.0.1:{port}", "plugin.discovery=service_load", "scheduled.rebalance.max.delay.ms=0", ""]))
    argv = [java, "-Xms64M", "-Xmx512M", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={workdir / 'log4j2.properties'}", "-cp", str(jars / "*"),
            "org.apache.kafka.connect.cli.ConnectDistributed", str(workdir / "worker.properties")]
    console = open(workdir / "console.log", "wb")  # noqa: SIM115 - the JVM's stdout, closed by the finalizer
    proc = subprocess.Popen(argv, stdout=console, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)

    def stop() -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        console.close()
        admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
        for f in admin.delete_topics(topics).values():
            try:
                f.result(30)
            except Exception:  # noqa: BLE001 - cleanup only; the names are unique to this run
                pass

    request.addfinalizer(stop)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"Kafka Connect exited with {proc.returncode}; see {workdir}/connect.log")
        try:
            return call(url, "GET", "/connectors", timeout=5)[0] == 200
        except OSError:
            return False

    wait_until(ready, 120, f"Kafka Connect at {url} to serve /connectors (log: {workdir}/connect.log)")
    return url


@pytest.fixture
def pair(stack, unique, tmp_path, request, make_topic) -> dict[str, Any]:
    (tmp_path / "connect").mkdir()
    connect = _start_connect(stack, tmp_path / "connect", request)
    eosink = start_worker(stack, unique, "w-compat", tmp_path)
    request.addfinalizer(eosink.stop)
    topic = make_topic(1)
    return {"connect": connect, "eosink": eosink.url, "topic": topic, "dir": tmp_path,
            "configs": {"connect": {"connector.class": CONNECT_CLASS, "topics": topic, "file": str(tmp_path / "connect.txt")},
                        "eosink": {"connector.class": "filesystem", "topics": topic, "file.path": str(tmp_path / "eosink")}}}


# -- comparing ------------------------------------------------------------------------------------------------------
def differences(connect: tuple[int, Any, dict[str, str]], eosink: tuple[int, Any, dict[str, str]], *,
                map_keys: bool = False) -> list[str]:
    """Status codes, the Allow header and JSON key sets (recursively; not values) that differ."""
    out = []
    if connect[0] != eosink[0]:
        out.append(f"status: connect {connect[0]}, eosink {eosink[0]}")
    if ("Allow" in eosink[2]) != ("Allow" in connect[2]):
        out.append(f"header Allow: {'eosink' if 'Allow' in eosink[2] else 'connect'} sends it")
    _keys("$", connect[1], eosink[1], out, map_keys)
    return out


def _keys(at: str, c: Any, e: Any, out: list[str], map_keys: bool = False) -> None:
    if isinstance(c, list) and isinstance(e, list):
        if c and e:  # lengths are values; element shapes are compared when both have some
            _keys(f"{at}[]", _merged(c), _merged(e), out)
        return
    if isinstance(c, dict) and isinstance(e, dict):
        if map_keys:  # keys are names (connectors, loggers): compare the shape of the values
            if c and e:
                _keys(f"{at}.*", _merged(list(c.values())), _merged(list(e.values())), out)
            return
        if set(c) - set(e):
            out.append(f"{at} keys: connect only {sorted(set(c) - set(e))}")
        if set(e) - set(c):
            out.append(f"{at} keys: eosink adds {sorted(set(e) - set(c))}")
        for k in sorted(set(c) & set(e)):
            _keys(f"{at}.{k}", c[k], e[k], out)
        return
    kinds = ((isinstance(c, dict), isinstance(c, list)), (isinstance(e, dict), isinstance(e, list)))
    if kinds[0] != kinds[1] and c is not None and e is not None:
        out.append(f"{at}: connect {type(c).__name__}, eosink {type(e).__name__}")


def _merged(items: list[Any]) -> Any:
    """The union of the keys of a list's objects (its first element when they are not objects)."""
    dicts = [i for i in items if isinstance(i, dict)]
    if not dicts:
        return items[0]
    merged: dict[str, Any] = {}
    for d in dicts:
        for k, v in d.items():
            merged.setdefault(k, v)
    return merged


def _call(url: str, method: str, path: str, body: Any) -> tuple[int, Any, dict[str, str]]:
    """One call; Connect's transient 409 while its group rebalances is retried (eosink has no rebalance barrier)."""
    deadline = time.monotonic() + 30
    while True:
        r = call(url, method, path, body)
        if not (r[0] == 409 and "rebalance" in str(r[1])) or time.monotonic() > deadline:
            return r
        time.sleep(0.5)


def _tasks_running(url: str) -> bool:
    s = call(url, "GET", f"/connectors/{NAME}/status")[1]
    return bool(isinstance(s, dict) and s.get("tasks") and all(t["state"] == "RUNNING" for t in s["tasks"]))


def _no_tasks(url: str) -> bool:
    s = call(url, "GET", f"/connectors/{NAME}/status")[1]
    return isinstance(s, dict) and s.get("tasks") == []


# -- the walk -------------------------------------------------------------------------------------------------------
def test_every_call_answers_as_kafka_connect_4_but_for_the_listed_differences(pair):
    both = ("connect", "eosink")
    cfg = pair["configs"]
    n = NAME
    offsets = {"offsets": [{"partition": {"kafka_topic": pair["topic"], "kafka_partition": 0}, "offset": {"kafka_offset": 0}}]}
    plugin = {"connect": "FileStreamSinkConnector", "eosink": "filesystem"}
    # (label, method, path, body per side or the same for both, options)
    steps: list[tuple[str, str, str | dict[str, str], Any, dict[str, Any]]] = [
        ("POST /connectors", "POST", "/connectors", {s: {"name": n, "config": cfg[s]} for s in both}, {"per_side": True}),
        ("WAIT running", "", "", None, {}),
        ("GET /", "GET", "/", None, {}),
        ("GET /connectors", "GET", "/connectors", None, {}),
        ("GET /connectors?expand=status&expand=info", "GET", "/connectors?expand=status&expand=info", None,
         {"map_keys": True}),
        ("GET /connectors/{n}", "GET", f"/connectors/{n}", None, {}),
        ("GET /connectors/{n}/config", "GET", f"/connectors/{n}/config", None, {"values_only": True}),
        ("GET /connectors/{n}/status", "GET", f"/connectors/{n}/status", None, {}),
        ("GET /connectors/{n}/tasks", "GET", f"/connectors/{n}/tasks", None, {}),
        ("GET /connectors/{n}/tasks/0/status", "GET", f"/connectors/{n}/tasks/0/status", None, {}),
        ("GET /connectors/{n}/topics", "GET", f"/connectors/{n}/topics", None, {}),
        ("PUT /connectors/{n}/topics/reset", "PUT", f"/connectors/{n}/topics/reset", None, {}),
        ("GET /connectors/{n}/offsets", "GET", f"/connectors/{n}/offsets", None, {}),
        ("PUT /connectors/{n}/pause", "PUT", f"/connectors/{n}/pause", None, {}),
        ("PUT /connectors/{n}/resume", "PUT", f"/connectors/{n}/resume", None, {}),
        ("WAIT running", "", "", None, {}),
        ("POST /connectors/{n}/restart", "POST", f"/connectors/{n}/restart", None, {}),
        ("POST /connectors/{n}/restart?includeTasks=true&onlyFailed=false", "POST",
         f"/connectors/{n}/restart?includeTasks=true&onlyFailed=false", None, {}),
        ("WAIT running", "", "", None, {}),
        ("POST /connectors/{n}/restart?includeTasks=true&onlyFailed=true", "POST",
         f"/connectors/{n}/restart?includeTasks=true&onlyFailed=true", None, {}),
        ("POST /connectors/{n}/tasks/0/restart", "POST", f"/connectors/{n}/tasks/0/restart", None, {}),
        ("PATCH /connectors/{n}/config", "PATCH", f"/connectors/{n}/config", {"tasks.max": "1"}, {}),
        ("PUT /connectors/{n}/config", "PUT", f"/connectors/{n}/config", cfg, {"per_side": True}),
        ("POST /connectors (409 duplicate)", "POST", "/connectors", {s: {"name": n, "config": cfg[s]} for s in both},
         {"per_side": True}),
        ("POST /connectors (400 bad config)", "POST", "/connectors",
         {s: {"name": "bad", "config": {**cfg[s], "tasks.max": "many"}} for s in both}, {"per_side": True}),
        ("PATCH /connectors/{n}/config (400)", "PATCH", f"/connectors/{n}/config", {"tasks.max": "many"}, {}),
        ("PATCH /connectors/{n}/offsets (400 not stopped)", "PATCH", f"/connectors/{n}/offsets", offsets, {}),
        ("PUT /connectors/{n}/stop", "PUT", f"/connectors/{n}/stop", None, {}),
        ("WAIT stopped", "", "", None, {}),
        ("GET /connectors/{n}/status (stopped)", "GET", f"/connectors/{n}/status", None, {}),
        ("PATCH /connectors/{n}/offsets", "PATCH", f"/connectors/{n}/offsets", offsets, {}),
        ("DELETE /connectors/{n}/offsets", "DELETE", f"/connectors/{n}/offsets", None, {}),
        ("GET /connector-plugins", "GET", "/connector-plugins", None, {}),
        ("GET /connector-plugins/{p}/config", "GET", {s: f"/connector-plugins/{plugin[s]}/config" for s in both}, None,
         {}),
        ("PUT /connector-plugins/{p}/config/validate", "PUT",
         {s: f"/connector-plugins/{plugin[s]}/config/validate" for s in both}, cfg, {"per_side": True}),
        ("GET /admin/loggers", "GET", "/admin/loggers", None, {"map_keys": True}),
        ("GET /admin/loggers/root", "GET", "/admin/loggers/root", None, {}),
        ("PUT /admin/loggers/{logger}", "PUT", "/admin/loggers/root", {"level": "INFO"}, {}),
        ("PUT /admin/loggers/{logger} (bad level)", "PUT", "/admin/loggers/root", {"level": "LOUD"}, {}),
        ("PUT /admin/loggers/{logger}?scope=cluster", "PUT", "/admin/loggers/root?scope=cluster", {"level": "INFO"}, {}),
        ("GET /admin/loggers/{logger} (404)", "GET", "/admin/loggers/no.such.logger", None, {}),
        ("GET /connectors/ghost (404)", "GET", "/connectors/ghost", None, {}),
        ("PATCH /connectors/ghost/config (404)", "PATCH", "/connectors/ghost/config", {"tasks.max": "1"}, {}),
        ("PUT /connectors/ghost/topics/reset (404)", "PUT", "/connectors/ghost/topics/reset", None, {}),
        ("DELETE /connectors (405)", "DELETE", "/connectors", None, {}),
        ("DELETE /connectors/{n}", "DELETE", f"/connectors/{n}", None, {}),
        ("GET /connectors/{n} (deleted)", "GET", f"/connectors/{n}", None, {}),
    ]
    found: dict[str, list[str]] = {}
    for label, method, path, body, opts in steps:
        if label == "WAIT running":
            for side in both:
                wait_until(lambda s=side: _tasks_running(pair[s]), 90, f"{side}'s task to run")
            continue
        if label == "WAIT stopped":
            for side in both:
                wait_until(lambda s=side: _no_tasks(pair[s]), 90, f"{side}'s tasks to stop")
            continue
        answers = {}
        for side in both:
            p = path[side] if isinstance(path, dict) else path
            b = body[side] if opts.get("per_side") else body
            answers[side] = _call(pair[side], method, p, b)
        # a config's keys are the connector's own (file vs file.path), not the API's
        answers = {s: (a[0], _without_configs(a[1], whole=bool(opts.get("values_only"))), a[2])
                       for s, a in answers.items()}
        diffs = differences(answers["connect"], answers["eosink"], map_keys=bool(opts.get("map_keys")))
        if diffs or label in INTENDED:
            found[label] = diffs
    expected = {label: sorted(d) for label, d in INTENDED.items()}
    assert {label: sorted(d) for label, d in found.items()} == expected, (
        "eosink's REST API drifted from Kafka Connect 4 (or an intended difference went away): "
        f"{ {label: d for label, d in found.items() if sorted(d) != expected.get(label)} }")


def _without_configs(body: Any, whole: bool) -> Any:
    """A connector config's keys are the plugin's (file vs file.path): leave every ``config`` out of the comparison."""
    if whole:
        return {}
    if isinstance(body, dict):
        return {k: {} if k == "config" else _without_configs(v, False) for k, v in body.items()}
    if isinstance(body, list):
        return [_without_configs(b, False) for b in body]
    return body
