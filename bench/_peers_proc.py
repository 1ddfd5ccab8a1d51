"""Processes for bench/bench_peers.py: a Kafka Connect standalone worker with one plugin, and one
``eosink worker``, each sampled from /proc (CPU of every thread, peak RSS) until a probe says done.

Both sides are measured the same way: the process is started with no connector and, once its REST
API answers, the connector is POSTed to it and the clock starts. A ``probe`` (rows visible in
PostgreSQL, rows in the Iceberg table's current snapshot) is polled every ``poll_s``; the run is
timed from the POST, and from the first time the probe saw anything, to the first time it saw every
record. CPU is the process's user + system time (every thread) over the same span from the POST,
peak RSS its VmHWM (start-up included).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.bench_e2e import drop_cluster, free_port, http, proc_status, stop_worker, wait_ready
from bench.bench_worker import CONNECT_JVM_OPTS, Result, _stop_group, cpu_of

REPO = Path(__file__).resolve().parent.parent
#: Probe: how many of the records a reader sees now (0 while the table does not exist yet).
Probe = Callable[[], int]


@dataclass
class Run(Result):
    """One side of one comparison, timed from the POST to every record visible (``seconds``); ``cpu_s``
    is the user + system CPU of its process, every thread, over the same span."""

    seconds_from_first: float = 0.0  # from the first record visible to every record visible
    peak_rss_mb: float = 0.0

    @property
    def cpu_us_per_row(self) -> float:
        return self.cpu_s / self.records * 1e6 if self.records else 0.0


def _watch(pid: int, alive: Callable[[], bool], probe: Probe, n: int, t0: float, cpu0: float,
           poll_s: float, timeout_s: float, what: str) -> tuple[float, float, float]:
    """Poll ``probe`` until it sees ``n``: (seconds, seconds from the first record seen, CPU seconds)."""
    t_first: float | None = None
    while True:
        if not alive():
            raise RuntimeError(f"{what} exited or its task failed before delivering {n:,} records")
        seen = probe()
        now = time.perf_counter()
        if seen and t_first is None:
            t_first = now
        if seen >= n:
            return now - t0, now - (t_first or now), cpu_of(pid) - cpu0
        if now - t0 > timeout_s:
            raise RuntimeError(f"{what}: {seen:,} of {n:,} records after {timeout_s:.0f}s")
        time.sleep(poll_s)


def _props(values: Mapping[str, Any]) -> str:
    return "".join(f"{k}={v}\n" for k, v in values.items())


def connect_worker_props(bootstrap: str, cdir: Path, plugin_dir: Path, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A standalone worker reading Kafka Connect's JSON envelope (keys as strings) read_committed; an
    override of None drops that key (``value.converter.schemas.enable`` under another converter)."""
    props = {
        "bootstrap.servers": bootstrap,
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "true",
        "offset.storage.file.filename": cdir / "connect.offsets",
        "offset.flush.interval.ms": 1000,
        "consumer.isolation.level": "read_committed",
        "consumer.auto.offset.reset": "earliest",
        "plugin.path": plugin_dir,
        # Both plugins list their connectors in ServiceLoader manifests: no reflective scan of ~100 jars.
        "plugin.discovery": "service_load",
        **overrides,
    }
    return {k: v for k, v in props.items() if v is not None}


def _post(base: str, name: str, config: Mapping[str, Any]) -> None:
    status, body = http("POST", f"{base}/connectors", {"name": name, "config": {k: str(v) for k, v in config.items()}})
    if status != 201:
        raise RuntimeError(f"POST {base}/connectors: {status} {body}")


def _connect_ready(base: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if http("GET", f"{base}/connectors", timeout=2)[0] == 200:
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"Kafka Connect did not start (see {log})")
        time.sleep(0.2)


def _connect_alive(proc: subprocess.Popen[bytes], status_url: str) -> bool:
    """The JVM runs and its task has not failed (a failed task stays failed: no use waiting)."""
    if proc.poll() is not None:
        return False
    status, body = http("GET", status_url, timeout=5)
    return not (status == 200 and any(t.get("state") == "FAILED" for t in json.loads(body).get("tasks", [])))


def run_connect(name: str, plugin: str, worker: Mapping[str, Any], connector: Mapping[str, Any], bootstrap: str,
                workdir: Path, n: int, probe: Probe, poll_s: float, timeout_s: float, classpath: Sequence[str] = ()) -> Run:
    """ConnectStandalone (jars of ``jvm/connect``) with the plugin of ``jvm/<plugin>``, started with no
    connector; once its REST API answers, ``connector`` is POSTed and the clock starts. ``classpath``: more
    ``jvm/<name>`` folders whose jars join the worker's own classpath (a converter the worker's config names:
    Apicurio's lists itself in no ServiceLoader manifest, so a plugin folder would hide it from service_load)."""
    from eosink.worker.stack import jvm

    cp = os.pathsep.join([jvm.classpath("connect", "kafka-connect"), *(jvm.classpath(c, c) for c in classpath)])
    plugin_jars = jvm.resolve_jars(plugin, plugin)
    java = jvm.java("kafka-connect")
    cdir = workdir / f"connect-{connector['name']}"
    (cdir / "plugins").mkdir(parents=True)
    (cdir / "plugins" / plugin).symlink_to(plugin_jars, target_is_directory=True)
    log = cdir / "connect.log"
    (cdir / "log4j2.properties").write_text(
        "status = warn\nappender.file.type = File\nappender.file.name = file\n"
        f"appender.file.fileName = {log}\n"
        "appender.file.layout.type = PatternLayout\nappender.file.layout.pattern = [%d] %p %m (%c)%n\n"
        "rootLogger.level = info\nrootLogger.appenderRef.file.ref = file\n")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    props = {**connect_worker_props(bootstrap, cdir, cdir / "plugins", worker), "listeners": base}
    (cdir / "worker.properties").write_text(_props(props))
    argv = [java, *CONNECT_JVM_OPTS, f"-Dlog4j2.configurationFile={cdir / 'log4j2.properties'}", "-cp", cp,
            "org.apache.kafka.connect.cli.ConnectStandalone", str(cdir / "worker.properties")]
    with open(cdir / "console.log", "wb") as console:
        launched = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=console, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            _connect_ready(base, proc, log)
            ready_s = time.perf_counter() - launched
            cpu0, t0 = cpu_of(proc.pid), time.perf_counter()
            _post(base, str(connector["name"]), {k: v for k, v in connector.items() if k != "name"})
            alive = functools.partial(_connect_alive, proc, f"{base}/connectors/{connector['name']}/status")
            seconds, from_first, cpu = _watch(proc.pid, alive, probe, n, t0, cpu0, poll_s, timeout_s,
                                              f"Kafka Connect (see {log})")
            rss = proc_status(proc.pid)["VmHWM"] / 1024
            startup_cpu = cpu0
        finally:
            _stop_group(proc)
    return Run(name, n, seconds=seconds, cpu_s=cpu, seconds_from_first=from_first, peak_rss_mb=rss,
               extra={"log": str(log), "jvm_ready_s": round(ready_s, 2), "startup_cpu_s": round(startup_cpu, 2)})


@contextlib.contextmanager
def eosink_worker(ep: Any, cluster: str, logdir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """One ``eosink worker`` process (a cluster of its own), ready: its REST base URL and process."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = logdir / f"worker-{cluster}.log"
    env = {**os.environ, "EOSINK_LOG_FORMAT": "json", "EOSINK_LOG_LEVEL": os.environ.get("EOSINK_LOG_LEVEL", "INFO")}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "eosink.worker.clients.cli", "worker", "--bootstrap-servers", ep.kafka_bootstrap,
             "--zookeeper", ep.zookeeper_hosts, "--cluster", cluster, "--worker-id", "w1", "--rest-port", str(port),
             "--rest-host", "127.0.0.1"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(base, proc, log_path)
        yield base, proc
    finally:
        stop_worker(proc)
        drop_cluster(ep.zookeeper_hosts, cluster)


def run_eosink(name: str, ep: Any, connector: str, config: Mapping[str, Any], workdir: Path, n: int, probe: Probe,
               poll_s: float, timeout_s: float) -> Run:
    """A fresh worker process; the connector POSTed; timed from the POST to every record visible."""
    with eosink_worker(ep, connector, workdir) as (base, proc):
        cpu0, t0 = cpu_of(proc.pid), time.perf_counter()
        _post(base, connector, config)
        seconds, from_first, cpu = _watch(proc.pid, lambda: proc.poll() is None, probe, n, t0, cpu0, poll_s, timeout_s,
                                          f"eosink worker (see {workdir / f'worker-{connector}.log'})")
        rss = proc_status(proc.pid)["VmHWM"] / 1024
        http("DELETE", f"{base}/connectors/{connector}")
    return Run(name, n, seconds=seconds, cpu_s=cpu, seconds_from_first=from_first, peak_rss_mb=rss,
               extra={"log": str(workdir / f"worker-{connector}.log"), "startup_cpu_s": round(cpu0, 2)})
