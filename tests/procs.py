"""Real worker processes for the crash and cluster tests, and an outbox to count against."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer

from eosink.worker.stack.proc import free_port  # noqa: F401  (the tests import it from here)

REPO = Path(__file__).resolve().parent.parent


class WorkerProcess:
    """``eosink worker`` as a child process with its own log file."""

    def __init__(self, stack, cluster: str, worker_id: str, log_dir: Path, *, fault: str | None = None,
                 session_timeout: float = 4.0, extra_env: dict[str, str] | None = None, metrics_port: int = 0,
                 zookeeper: str | None = None, rest_port: int = 0, extra_args: list[str] | None = None,
                 cwd: Path | None = None) -> None:
        self.worker_id = worker_id
        self.rest_port = rest_port
        self.url = f"http://127.0.0.1:{rest_port}"
        self.log_path = log_dir / f"{worker_id}.log"
        env = {**os.environ, "EOSINK_LOG_FORMAT": "json", "EOSINK_PG_DSN": stack.postgres_dsn, **(extra_env or {})}
        env.pop("EOSINK_FAULT", None)
        if fault:
            env["EOSINK_FAULT"] = fault
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - the worker process writes it for its whole life
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "eosink.worker.clients.cli", "worker", "--bootstrap-servers", stack.kafka_bootstrap,
             "--zookeeper", zookeeper or stack.zookeeper_hosts, "--cluster", cluster, "--worker-id", worker_id,
             "--session-timeout", str(session_timeout), "--metrics-port", str(metrics_port), "--metrics-host", "127.0.0.1",
             "--rest-port", str(rest_port), "--rest-host", "127.0.0.1", *(extra_args or [])],
            cwd=cwd or REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.returncode is not None:
                self._log.close()

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.wait(10)

    def log_text(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")


def publish(bootstrap: str | dict, topic: str, partitions: int, *, txns: int, per_txn: int, aborted_every: int = 0,
            prefix: str = "r", txn_prefix: str = "test-") -> tuple[set[str], set[str]]:
    """Publish ``txns`` transactions; every ``aborted_every``-th is aborted. Returns (committed ids, aborted ids).

    ``bootstrap``: the servers, or a whole librdkafka config (a secured cluster's principal); the
    transactional.id is ``<txn_prefix><topic>-<prefix>`` (a least-privilege publisher owns a prefix)."""
    conf = {"bootstrap.servers": bootstrap} if isinstance(bootstrap, str) else dict(bootstrap)
    p = Producer({**conf, "transactional.id": f"{txn_prefix}{topic}-{prefix}", "linger.ms": 5})
    p.init_transactions(30)
    committed: set[str] = set()
    aborted: set[str] = set()
    n = 0
    for t in range(txns):
        p.begin_transaction()
        ids = []
        for _ in range(per_txn):
            rid = f"{prefix}-{n}"
            n += 1
            ids.append(rid)
            p.produce(topic, value=json.dumps({"id": rid, "payload": "x" * 100}).encode(), partition=n % partitions)
        if aborted_every and t % aborted_every == aborted_every - 1:
            p.flush(30)
            p.abort_transaction(30)
            aborted.update(ids)
        else:
            p.commit_transaction(30)
            committed.update(ids)
    return committed, aborted



def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.25) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def cluster_init(cluster: str, env: dict[str, str], hosts: str | None = None) -> subprocess.CompletedProcess[str]:
    """``eosink cluster init`` in a process of its own, as an operator runs it (``env``: its ZooKeeper settings;
    ``hosts``: its ``--zookeeper``, else the local stack's)."""
    where = ["--zookeeper", hosts] if hosts else []
    return subprocess.run([sys.executable, "-m", "eosink.worker.clients.cli", "cluster", "init", *where, "--cluster", cluster],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **env}, cwd=REPO)


def register(zk_hosts: str, cluster: str, name: str, config: dict, credentials=None, ca_file: str | None = None) -> None:
    """Store a connector as the CLI's direct mode does (``credentials``/``ca_file``: a secured ZooKeeper, whose cluster
    root is created first, as ``eosink cluster init`` does)."""
    from eosink.worker.control.config import parse_connector
    from eosink.worker.control.store import ConnectorStore
    from eosink.worker.engine.zk import ZkSession

    parse_connector(name, config, resolve=False)  # the same validation as the CLI and the REST API
    session = ZkSession(zk_hosts, cluster, credentials=credentials, ca_file=ca_file).start(create_root=True)
    try:
        ConnectorStore(session).put(name, config)
    finally:
        session.stop()


def fanout_config(stack, table: str, topic: str, out: Path, bucket: str) -> dict[str, str]:
    """A connector delivering ``topic`` into PostgreSQL (table ``table``), files under ``out`` and an
    S3 bucket at once, in cycles of at most 400 records every 200 ms: many transactions, three sinks."""
    return {
        "connector.class": "fanout", "topics": topic, "sinks": "db,files,archive",
        "sinks.db.connector.class": "postgres", "sinks.db.connection.url": stack.postgres_dsn,
        "sinks.db.table.name.format": table,
        "sinks.files.connector.class": "filesystem", "sinks.files.file.path": str(out),
        "sinks.archive.connector.class": "s3", "sinks.archive.s3.bucket.name": bucket,
        "sinks.archive.s3.endpoint.url": stack.s3["endpoint_url"], "sinks.archive.s3.region": stack.s3["region_name"],
        "sinks.archive.aws.access.key.id": stack.s3["aws_access_key_id"],
        "sinks.archive.aws.secret.access.key": stack.s3["aws_secret_access_key"],
        "commit.interval.ms": "200", "batch.max.records": "400",
    }


class PrivateMinio:
    """A MinIO of its own (port, data directory) for a test that kills it: never the stack's.

    ``kill()`` is a SIGKILL; ``start()`` again serves the same data directory, as a server
    restarted after a crash does. Uses the stack's binary and credentials.
    """

    def __init__(self, directory: Path) -> None:
        self.data_dir = directory / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port, self.console_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = directory / "minio.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def endpoint(self) -> dict[str, str]:
        from eosink.worker.stack.components.s3 import CREDENTIALS

        return {"endpoint_url": self.url, **CREDENTIALS}

    def start(self) -> PrivateMinio:
        from eosink.worker.stack.components import s3

        argv = s3.server_argv(s3.binary(), self.data_dir, self.port, self.console_port)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, env=s3.server_env(), stdout=log, stderr=subprocess.STDOUT)

        def up() -> bool:
            import urllib.request

            try:
                urllib.request.urlopen(f"{self.url}/minio/health/ready", timeout=2).read()
                return True
            except OSError:
                assert self.proc is not None and self.proc.poll() is None, f"minio exited; see {self.log_path}"
                return False

        wait_until(up, 60, f"minio on {self.url} (log {self.log_path})", interval=0.1)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None


class TcpProxy:
    """A TCP proxy between clients and one server that the test can cut, heal and slow down.

    ``sever()`` is a blackhole, not a reset: established connections stop forwarding silently
    (the client sees a hang, as with a pulled cable or a dropped route) and new ones are closed
    on accept. ``heal()`` drops the severed connections so clients reconnect through it.
    ``latency(seconds)`` delays every chunk in both directions by that much (a slow link).
    """

    def __init__(self, target: tuple[str, int], port: int = 0) -> None:
        self.target = target
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.cut = threading.Event()
        self.delay = 0.0
        self.accepted = 0
        self.conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if self.cut.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()  # the server is down: the client sees a refused connection
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self.accepted += 1
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        # Latency without throttling: a reader stamps each chunk, a writer sends it when it is due,
        # so a slow link still carries many chunks in flight.
        chunks: queue.Queue[tuple[float, bytes] | None] = queue.Queue()

        def writer() -> None:
            while True:
                item = chunks.get()
                if item is None:
                    break
                due, data = item
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if self.cut.is_set():
                    continue
                try:
                    b.sendall(data)
                except OSError:
                    break
            try:
                b.shutdown(2)
            except OSError:
                pass

        threading.Thread(target=writer, daemon=True).start()
        try:
            while not self.cut.is_set():
                data = a.recv(65536)
                if not data or self.cut.is_set():
                    break
                chunks.put((time.monotonic() + self.delay, data))
        except OSError:
            pass
        finally:
            if not self.cut.is_set():
                chunks.put(None)

    def latency(self, seconds: float) -> None:
        """Delay every chunk by ``seconds`` in each direction from now on (0 to stop)."""
        self.delay = seconds

    def sever(self) -> None:
        """Blackhole: established connections stop forwarding silently, new ones are refused."""
        self.cut.set()

    def heal(self) -> None:
        with self._lock:
            conns, self.conns = self.conns, []
        for c in conns:
            try:
                c.close()
            except OSError:
                pass
        self.cut.clear()

    def close(self) -> None:
        self.sock.close()
        self.heal()
