"""The container deployment, tested without a Docker engine (none runs here):

* ``docker/compose.yaml`` is valid Compose: YAML merge keys resolved as Compose does, then parsed
  by the ``compose-spec`` package (the Rust ``compose_spec`` crate: strict, an unknown key is an
  error) and validated against its Compose-Specification model;
* it refers only to files that exist, and the Dockerfiles copy only files that exist;
* the worker image installs eosink's ``worker`` extra (every sink, no PySpark);
* the image's ENTRYPOINT, run outside a container with the environment compose gives worker-1
  (hosts pointed at the local stack), starts a worker that joins the cluster and delivers; the
  image's HEALTHCHECK command passes against it; the ``register`` service's command registers a
  config through its REST API; SIGTERM stops it with exit code 0.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.procs import REPO, free_port, wait_until
from tests.restkit import call, pg_ids, produce

DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yaml"


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())  # PyYAML applies merge keys (<<), as Compose's loader does


def _version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _dockerfile(name: str) -> list[tuple[str, str]]:
    """(instruction, arguments) with continuation lines joined."""
    text = re.sub(r"\\\n", " ", (DOCKER / name).read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instr, _, rest = line.partition(" ")
            out.append((instr.upper(), rest.strip()))
    return out


def test_compose_file_is_valid_against_the_compose_specification():
    compose_spec = pytest.importorskip("compose_spec", reason="pip install compose-spec (test extra)")
    doc = _compose()
    parsed = compose_spec.PyCompose.from_json(json.dumps(doc))  # raises on any key the spec does not know
    spec = parsed.to_spec()
    assert {"zookeeper", "kafka", "postgres", "minio", "worker-1", "worker-2", "worker-3", "register"} <= set(spec.services)
    broken = {**doc, "services": {**doc["services"], "worker-1": {**doc["services"]["worker-1"], "helthcheck": {}}}}
    with pytest.raises(ValueError):
        compose_spec.PyCompose.from_json(json.dumps(broken))


def test_compose_services_are_wired_as_documented():
    services = _compose()["services"]
    kafka = services["kafka"]["environment"]
    assert "controller" in kafka["KAFKA_PROCESS_ROLES"] and "KAFKA_ZOOKEEPER_CONNECT" not in kafka, "Kafka runs in KRaft mode"
    assert "max_prepared_transactions=64" in services["postgres"]["command"]
    workers = [n for n in services if n.startswith("worker-")]
    assert len(workers) == 3
    ids, ports = set(), set()
    for n in workers:
        env = services[n]["environment"]
        assert {"EOSINK_BOOTSTRAP_SERVERS", "EOSINK_ZOOKEEPER", "EOSINK_CLUSTER", "EOSINK_REST_PORT", "EOSINK_PG_DSN"} <= set(env)
        ids.add(env["EOSINK_WORKER_ID"])
        ports |= {p.split(":")[0] for p in services[n]["ports"]}
        assert services[n].get("image") == f"eosink-worker:{_version()}"
    assert len(ids) == len(ports) == 3
    for name, s in services.items():
        for dep in s.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown service {dep}"
    register = services["register"]
    assert register["entrypoint"] + register["command"][:3] == ["eosink", "connectors", "--url", "http://worker-1:8083"]
    assert register["depends_on"]["worker-1"]["condition"] == "service_healthy"


def test_compose_images_are_pinned_by_release_tag_not_latest_or_a_bare_major():
    for name, s in _compose()["services"].items():
        image = s["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest", f"{name}: {image} is not pinned"
        assert re.search(r"^\d+\.\d+(\.\d+|-)|^RELEASE\.\d{4}-\d\d-\d\dT", tag), f"{name}: {image} names no exact release"
    assert not any(s["image"].endswith(":latest") for s in _compose()["services"].values())


def test_compose_worker_environment_sets_every_variable_the_configs_read():
    env = _compose()["services"]["worker-1"]["environment"]
    # compose.yaml runs the open stack; configs/*-secure.json are registered on a locked-down one
    # (eosink stack up --secure), whose variables make secure-demo sets (see worker/stack/demo_access.py).
    for path in sorted(p for p in (REPO / "configs").glob("*.json") if not p.stem.endswith("-secure")):
        wanted = set(re.findall(r"\$\{env:(\w+)\}", path.read_text()))
        assert wanted <= set(env), f"{path.name} reads {sorted(wanted - set(env))}, which compose's workers lack"


def test_spark_image_pins_bookworm_for_openjdk_17():
    steps = _dockerfile("spark-job.Dockerfile")
    assert ("ARG", "BASE_IMAGE=python:3.11-slim-bookworm") in steps
    assert any(i == "RUN" and "openjdk-17-jre-headless" in a for i, a in steps)
    assert any(i == "USER" and a not in ("root", "0") for i, a in steps)


def test_compose_and_dockerfiles_refer_only_to_files_that_exist():
    services = _compose()["services"]
    for name, s in services.items():
        build = s.get("build")
        if build:
            context = (DOCKER / build["context"]).resolve()
            assert context.is_dir(), f"{name}: build context {context}"
            dockerfile = context / build["dockerfile"]
            assert dockerfile.is_file(), f"{name}: {dockerfile}"
            for instr, args in _dockerfile(dockerfile.name):
                if instr == "COPY" and not args.startswith("--from"):
                    for src in shlex.split(args)[:-1]:
                        assert (context / src).exists(), f"{dockerfile.name}: COPY {src} does not exist"
        for volume in s.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):
                assert (DOCKER / source).resolve().exists(), f"{name}: volume source {source}"
        for env_file in s.get("env_file", []) if isinstance(s.get("env_file"), list) else [s.get("env_file")] if s.get("env_file") else []:
            assert (DOCKER / env_file).is_file()
    assert list((REPO / "configs").glob("*.json")), "the register service applies configs/*.json"
    ignored = (REPO / ".dockerignore").read_text().split()
    for needed in ("worker", "connectors", "spark_jobs", "pyproject.toml", "constraints.txt", "README.md"):
        assert needed not in ignored


def test_worker_image_is_slim_non_root_and_installs_the_worker_extra_without_pyspark():
    steps = _dockerfile("worker.Dockerfile")
    froms = [a.split()[0] for i, a in steps if i == "FROM"]
    assert ("ARG", "BASE_IMAGE=python:3.11-slim-bookworm") in steps and set(froms) == {"${BASE_IMAGE}"}, \
        "both stages build on BASE_IMAGE, by default the public python:3.11-slim-bookworm"
    final = steps[max(i for i, (instr, _) in enumerate(steps) if instr == "FROM"):]
    user = [a for i, a in final if i == "USER"]
    assert user and user[-1] not in ("root", "0")
    assert any(i == "HEALTHCHECK" and "/health" in a for i, a in final)
    assert ("ENTRYPOINT", '["eosink", "worker"]') in final
    installs = [a for i, a in steps if i == "RUN" and "pip install" in a]
    assert any('".[worker]"' in a and "-c constraints.txt" in a for a in installs), \
        "docker/worker.Dockerfile must install eosink with its worker extra, pinned by constraints.txt"
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def expand(name: str) -> set[str]:
        out: set[str] = set()
        for req in extras[name]:
            m = re.fullmatch(r"eosink\[([\w,]+)\]", req)
            out |= set().union(*(expand(n) for n in m.group(1).split(","))) if m else {req}
        return out

    worker = expand("worker")
    assert not any(r.startswith("pyspark") for r in worker), "the worker extra must not pull PySpark"
    assert {"s3", "iceberg"} <= {n for n in extras if extras[n] and expand(n) <= worker}


def _entrypoint_shim(tmp_path: Path) -> Path:
    """``eosink`` as pip would install it from pyproject's [project.scripts], on a PATH of its own."""
    target = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]["eosink"]
    module, func = target.split(":")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "eosink"
    shim.write_text(f"#!{sys.executable}\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n")
    shim.chmod(0o755)
    return bindir


@pytest.mark.chaos
def test_image_entrypoint_with_compose_environment_joins_the_cluster_and_delivers(stack, unique, make_topic, pg, tmp_path):
    steps = dict(_dockerfile("worker.Dockerfile")[::-1])  # last one wins
    entrypoint = json.loads(steps["ENTRYPOINT"])
    healthcheck = json.loads(re.search(r"CMD (\[.*\])", steps["HEALTHCHECK"]).group(1))
    compose_env = {k: str(v) for k, v in _compose()["services"]["worker-1"]["environment"].items()}
    port = free_port()
    local = {"kafka:9092": stack.kafka_bootstrap, "zookeeper:2181": stack.zookeeper_hosts}
    env = {k: local.get(v, v) for k, v in compose_env.items()}
    env.update(EOSINK_PG_DSN=stack.postgres_dsn, EOSINK_CLUSTER=unique, EOSINK_REST_PORT=str(port),
               EOSINK_REST_ADVERTISED_URL=f"http://127.0.0.1:{port}", EOSINK_HOME=str(tmp_path / "home"))
    bindir = _entrypoint_shim(tmp_path)
    base = {k: v for k, v in os.environ.items() if not k.startswith("EOSINK_")}
    full_env = {**base, **env, "PATH": f"{bindir}{os.pathsep}{base['PATH']}", "PYTHONPATH": str(REPO)}
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 - the worker process writes it for its whole life
    proc = subprocess.Popen(entrypoint, env=full_env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.poll() is None and _ready(url), 60, "the entrypoint's worker to be ready")
        root = call(url, "GET", "/")[1]
        assert root["eosink_cluster"] == unique and root["worker_id"] == "worker-1"
        # the register service's command, with /configs pointing at a directory of ours
        topic = make_topic(2)
        configs = tmp_path / "configs"
        configs.mkdir()
        (configs / "c.json").write_text(json.dumps({"name": unique, "config": {
            "connector.class": "postgres", "topics": topic, "connection.url": "${env:EOSINK_PG_DSN}",
            "table.name.format": unique, "commit.interval.ms": "200"}}))
        register = _compose()["services"]["register"]
        argv = [a.replace("http://worker-1:8083", url).replace("/configs", str(configs))
                for a in register["entrypoint"] + register["command"]]
        r = subprocess.run(argv, env=full_env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and f"created connector {unique}" in r.stdout, r.stderr
        produce(stack.kafka_bootstrap, topic, [(i % 2, json.dumps({"id": f"d{i}"}).encode()) for i in range(100)])
        wait_until(lambda: len(pg_ids(pg, unique)) == 100, 90, "delivery by the containerised worker")
        hc = subprocess.run(healthcheck, env=full_env, capture_output=True, text=True, timeout=10)
        assert hc.returncode == 0, hc.stderr
        members = call(url, "GET", f"/connectors/{unique}/status")[1]["tasks"]
        assert [t["worker_id"] for t in members] == ["worker-1"]
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
        log.close()
    assert rc == 0, (tmp_path / "worker.log").read_text()[-3000:]
    assert sorted(pg_ids(pg, unique)) == sorted(f"d{i}" for i in range(100))
    text = (tmp_path / "worker.log").read_text()
    assert all(json.loads(line) for line in text.splitlines() if line.startswith("{")), "EOSINK_LOG_FORMAT=json"
    assert '"worker_stopped"' in text


def _ready(url: str) -> bool:
    try:
        return call(url, "GET", "/ready", timeout=2)[0] == 200
    except OSError:
        return False
