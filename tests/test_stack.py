"""The local stack as its users see it: real servers, the CLI in subprocesses, no mocks.

Tests that read the shared stack (the one ``make test`` started) never stop it; tests that start
or break servers do so in a throw-away ``EOSINK_HOME`` under ``tmp_path`` on free ports.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eosink.worker.stack import StackNotRunning, load_endpoints, start_component, stop_component
from eosink.worker.stack.proc import free_port

REPO = Path(__file__).resolve().parent.parent
PORT_VARS = {
    "zookeeper": ["EOSINK_ZOOKEEPER_PORT"],
    "kafka": ["EOSINK_KAFKA_PORT", "EOSINK_KAFKA_CONTROLLER_PORT"],
    "postgres": ["EOSINK_POSTGRES_PORT"],
    "s3": ["EOSINK_S3_PORT", "EOSINK_S3_CONSOLE_PORT"],
    "registry": ["EOSINK_REGISTRY_PORT", "EOSINK_REGISTRY_MANAGEMENT_PORT"],
}


def run_stack(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m eosink.worker.stack ...`` as a user runs it (the shared stack's env unless ``env``)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "eosink.worker.stack", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def running(pid: int) -> bool:
    """True unless the process is gone or a zombie (exited, waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.fixture
def scratch_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Env for a throw-away stack: its own home and free ports; stopped again after the test."""
    env = dict(os.environ, EOSINK_HOME=str(tmp_path / "home"))
    for names in PORT_VARS.values():
        for name in names:
            env[name] = str(free_port())
    yield env
    run_stack("down", env=env)


def test_status_json_reports_every_component_running_and_matches_endpoints_file(stack) -> None:
    result = run_stack("status", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    components = report["components"]
    assert set(components) == {"zookeeper", "kafka", "postgres", "s3", "registry"}
    for name, component in components.items():
        assert component["state"] == "running", name
        assert running(component["pid"]), name
    written = json.loads(Path(report["endpoints_file"]).read_text())
    assert written == {name: component["endpoint"] for name, component in components.items()}
    assert stack.kafka_bootstrap == written["kafka"]["bootstrap_servers"]
    assert stack.zookeeper_hosts == written["zookeeper"]["hosts"]
    assert stack.postgres_dsn == written["postgres"]["dsn"]
    assert stack.s3 == written["s3"]
    assert stack.registry_url == written["registry"]["url"]


def test_up_on_a_running_stack_is_fast_and_keeps_every_server(stack) -> None:
    before = json.loads(run_stack("status", "--json").stdout)["components"]
    started = time.monotonic()
    result = run_stack("up")
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert elapsed < 3.0
    after = json.loads(run_stack("status", "--json").stdout)["components"]
    assert {n: c["pid"] for n, c in after.items()} == {n: c["pid"] for n, c in before.items()}
    assert result.stderr.count("already running") == 5


@pytest.mark.parametrize("component", ["zookeeper", "kafka", "postgres", "s3", "registry"])
def test_taken_port_is_a_clear_error_naming_component_and_log(scratch_env: dict[str, str], component: str) -> None:
    env_var = PORT_VARS[component][0]
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        result = run_stack("up", "--only", component, env={**scratch_env, env_var: str(port)})
    assert result.returncode == 1
    log = Path(scratch_env["EOSINK_HOME"]) / "stack" / "logs" / f"{component}.log"
    assert f"port {port} for {component} is in use by another process" in result.stderr
    assert env_var in result.stderr
    assert str(log) in result.stderr
    assert "Traceback" not in result.stderr
    assert not (Path(scratch_env["EOSINK_HOME"]) / "stack" / "run" / f"{component}.pid").exists()


def test_server_dying_at_start_is_reported_with_its_exit_code_and_log_tail(
    scratch_env: dict[str, str], tmp_path: Path
) -> None:
    fake_java = tmp_path / "jdk" / "bin" / "java"
    fake_java.parent.mkdir(parents=True)
    fake_java.write_text("#!/bin/sh\necho 'fake JVM: no such option' >&2\nexit 3\n")
    fake_java.chmod(0o755)
    result = run_stack("up", "--only", "zookeeper", env={**scratch_env, "JAVA_HOME": str(tmp_path / "jdk")})
    assert result.returncode == 1
    assert "zookeeper: the server exited with code 3 before it was ready" in result.stderr
    assert "fake JVM: no such option" in result.stderr
    assert "zookeeper.log" in result.stderr
    assert "Traceback" not in result.stderr


def test_down_leaves_no_process_behind_and_is_idempotent(scratch_env: dict[str, str]) -> None:
    result = run_stack("up", "--only", "zookeeper,s3", env=scratch_env)
    assert result.returncode == 0, result.stderr
    status = json.loads(run_stack("status", "--json", "--only", "zookeeper,s3", env=scratch_env).stdout)
    pids = [c["pid"] for c in status["components"].values()]
    assert all(running(pid) for pid in pids)

    result = run_stack("down", env=scratch_env)
    assert result.returncode == 0, result.stderr
    assert not [pid for pid in pids if running(pid)]
    run_dir = Path(scratch_env["EOSINK_HOME"]) / "stack" / "run"
    assert not list(run_dir.glob("*.pid"))
    assert not (Path(scratch_env["EOSINK_HOME"]) / "endpoints.json").exists()
    for var in ("EOSINK_ZOOKEEPER_PORT", "EOSINK_S3_PORT"):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", int(scratch_env[var])), timeout=2).close()

    assert run_stack("down", env=scratch_env).returncode == 0
    assert run_stack("status", env=scratch_env).returncode == 1


def test_single_component_stops_and_starts_through_the_api(
    scratch_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = Path(scratch_env["EOSINK_HOME"])
    for var in PORT_VARS["s3"]:
        monkeypatch.setenv(var, scratch_env[var])
    first = start_component("s3", home)
    assert load_endpoints(home).s3["endpoint_url"] == f"http://127.0.0.1:{scratch_env['EOSINK_S3_PORT']}"
    assert start_component("s3", home) == first  # already running: left alone
    stop_component("s3", home)
    assert not running(first)
    second = start_component("s3", home)
    assert second != first and running(second)
    stop_component("s3", home)
    assert not running(second)


def test_s3_without_its_binary_and_without_go_says_what_to_install(scratch_env: dict[str, str], tmp_path: Path) -> None:
    env = dict(scratch_env, XDG_CACHE_HOME=str(tmp_path / "empty-cache"), PATH=str(Path(sys.executable).parent))
    result = run_stack("up", "--only", "s3", env=env)
    assert result.returncode == 1
    assert "s3: the Go toolchain (`go`) was not found on PATH; it is needed once to build minio" in result.stderr
    assert "install Go 1.24+ (Debian: apt-get install golang-go, or put go on PATH)" in result.stderr
    assert "Traceback" not in result.stderr


def test_load_endpoints_without_a_stack_says_how_to_start_one(tmp_path: Path) -> None:
    with pytest.raises(StackNotRunning, match="eosink stack up"):
        load_endpoints(tmp_path)


def test_nodes_of_a_multi_broker_stack_starting_at_once_share_one_cluster_id(tmp_path: Path) -> None:
    """The nodes start concurrently; a check-then-write of the cluster id once gave them different
    ids, and their quorum refused each other's votes (INCONSISTENT_CLUSTER_ID)."""
    import threading

    from eosink.worker.stack.components import kafka
    from eosink.worker.stack.layout import StackLayout

    for _ in range(20):
        layout = StackLayout.for_home(tmp_path / f"home-{_}")
        nodes = kafka.nodes(layout, 3)
        ids: list[str] = []
        start = threading.Barrier(len(nodes))

        def ask(node: kafka.Kafka, start: threading.Barrier, ids: list[str]) -> None:
            start.wait()
            ids.append(node._cluster_id())

        threads = [threading.Thread(target=ask, args=(n, start, ids)) for n in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(ids) == 3 and len(set(ids)) == 1, ids


def test_a_new_kafka_cluster_id_never_starts_with_a_dash_the_storage_tool_would_read_as_a_flag() -> None:
    from eosink.worker.stack.components.kafka import new_cluster_id

    ids = [new_cluster_id() for _ in range(2000)]  # one plain draw in 64 starts with '-': ~31 expected here
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(i) == 22 for i in ids) and len(set(ids)) == len(ids)
