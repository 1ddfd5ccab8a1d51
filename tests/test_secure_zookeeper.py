"""ZooKeeper locked down: TLS only, SASL authentication required, every znode of a cluster its principal's alone.

An operator creates the cluster's root with ``eosink cluster init``; then one real worker,
authenticated as the stack's ZooKeeper principal, runs a connector end to end on the secure stack
(the filesystem sink, counted: every id once). Then, on the tree it left behind, a session without
credentials, a session of another principal and a worker of another cluster try to read,
overwrite, forge, delete and re-ACL the connector's config, its target state, the worker's
assignment and a decision-log entry: every attempt is refused and the data is unchanged. Wrong or
missing credentials, and a tree left open by a run without credentials, stop a worker with one
line naming ``zookeeper``, the address or path and the settings. (The login itself and the cluster
root: ``test_secure_zookeeper_login``.)
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, SessionClosedRequireSaslError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import OPEN_ACL_UNSAFE

from eosink.connectors.api.records import TopicPartition
from eosink.worker import paths
from eosink.worker.engine.zk import CoordinatorAuthError, ZkCredentials, ZkSession, kazoo_client
from tests.conftest import kafka_worker_env
from tests.procs import WorkerProcess, cluster_init, publish, wait_until

pytestmark = pytest.mark.secure

PARTITIONS = 3
WORKER = "zk-w1"


@dataclass
class SecuredRun:
    """What the end-to-end run left in ZooKeeper, and how to reach it."""

    hosts: str
    cluster: str
    root: str
    connector: str
    topic: str
    owner: ZkCredentials
    password_ref: str
    ca_file: str
    committed: set[str]
    delivered: list[str]
    other: ZkCredentials

    def targets(self) -> dict[str, str]:
        """The znodes an attacker wants, by name."""
        return {
            "config": paths.connector_config(self.root, self.connector),
            "target-state": paths.target_state(self.root, self.connector),
            "assignment": paths.assignment(self.root, WORKER),
            "decision-log": paths.partition(self.root, self.connector, TopicPartition(self.topic, 0)),
        }


def _client(hosts: str, creds: ZkCredentials | None = None, ca: str | None = None) -> KazooClient:
    c = kazoo_client(hosts, creds, ca, timeout=10)
    c.start(timeout=20)
    return c


def other_principal(material) -> ZkCredentials:
    """The secure stack's second cluster principal: a real user of the server, not this cluster's."""
    return ZkCredentials(material.user("zookeeper.other"), material.password("zookeeper.other"))


def _close(c: KazooClient) -> None:
    try:
        c.stop()
        c.close()
    except Exception:  # noqa: BLE001 - a session the server closed
        pass


def _file_ids(out: Path, connector: str) -> list[str]:
    ids: list[str] = []
    for f in sorted((out / connector / "committed").glob("*.jsonl")):
        ids.extend(json.loads(line)["value"]["id"] for line in f.read_text().splitlines() if line)
    return ids


def _log(w: WorkerProcess) -> str:
    """The log of a worker that may have exited (``log_text`` flushes a file closed once it did)."""
    return w.log_path.read_text(errors="replace")


def _owner_env(password: str, user: str, ca: str) -> dict[str, str]:
    # Kafka is locked down too: every worker of these tests is eosink-worker over SASL_SSL.
    return {"EOSINK_ZOOKEEPER_USER": user, "EOSINK_ZOOKEEPER_PASSWORD": password, "EOSINK_ZOOKEEPER_CA_FILE": ca,
            **kafka_worker_env()}


@pytest.fixture(scope="module")
def secured_run(secure_stack, secure_material, secure_zookeeper_env, secure_kafka_env, secure_kafka_admin,
                tmp_path_factory) -> Iterator[SecuredRun]:
    """A worker with the stack's ZooKeeper credentials delivers a topic end to end, then stops."""
    tmp = tmp_path_factory.mktemp("secure-zk")
    tag = uuid.uuid4().hex[:8]
    cluster, connector, topic = f"zk-{tag}", f"zk-files-{tag}", f"outbox.zk-{tag}"
    admin = AdminClient(secure_kafka_admin)
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[topic].result(30)
    owner = ZkCredentials(secure_material.user("zookeeper"), secure_material.password("zookeeper"))
    ref = secure_zookeeper_env["EOSINK_ZOOKEEPER_PASSWORD"]  # a ${file:...} reference: the worker resolves it
    ca = str(secure_material.ca_cert)
    init = cluster_init(cluster, {**secure_zookeeper_env}, secure_stack.zookeeper_hosts)
    assert init.returncode == 0, init.stderr
    session = ZkSession(secure_stack.zookeeper_hosts, cluster, credentials=owner, ca_file=ca).start()
    try:
        from eosink.worker.control.store import ConnectorStore

        ConnectorStore(session).put(connector, {"connector.class": "filesystem", "topics": topic, "file.path": str(tmp / "out"),
                                                "commit.interval.ms": "200"})
    finally:
        session.stop()
    committed, aborted = publish(secure_kafka_admin, topic, PARTITIONS, txns=6, per_txn=50, aborted_every=3)
    worker = WorkerProcess(secure_stack, cluster, WORKER, tmp, extra_env={**secure_zookeeper_env, **secure_kafka_env})
    try:
        wait_until(lambda: len(set(_file_ids(tmp / "out", connector))) >= len(committed) or worker.proc.poll() is not None,
                   120, f"delivery of {len(committed)} records")
        assert worker.proc.poll() is None, f"the worker exited: {worker.log_text()[-2000:]}"
        time.sleep(1.0)  # a few more commit intervals: a duplicate would show now
    finally:
        rc = worker.stop()
    log = _log(worker)
    assert rc == 0, log[-2000:]
    assert owner.password not in log
    delivered = _file_ids(tmp / "out", connector)
    assert not set(delivered) & aborted
    admin.delete_topics([topic])
    yield SecuredRun(secure_stack.zookeeper_hosts, cluster, paths.cluster_root(cluster), connector, topic, owner, ref, ca,
                     committed, delivered, other_principal(secure_material))


@pytest.fixture
def owner_zk(secured_run) -> Iterator[KazooClient]:
    c = _client(secured_run.hosts, secured_run.owner, secured_run.ca_file)
    yield c
    _close(c)


def test_worker_with_credentials_delivers_every_id_once_on_the_secure_zookeeper(secured_run, owner_zk):
    ids = secured_run.delivered
    assert len(ids) == len(set(ids)), f"{len(ids) - len(set(ids))} duplicates"
    assert set(ids) == secured_run.committed, f"missing {len(secured_run.committed - set(ids))}"
    # Every znode the run made is the principal's alone: no world entry, no other id.
    [expected] = secured_run.owner.acl

    def walk(path: str) -> Iterator[str]:
        yield path
        for child in owner_zk.get_children(path):
            yield from walk(f"{path}/{child}")

    nodes = list(walk(secured_run.root))
    assert set(secured_run.targets().values()) <= set(nodes), "the run did not leave the znodes the attacks need"
    for path in nodes:
        assert owner_zk.get_acls(path)[0] == [expected], f"{path} has a foreign ACL"


def _attacks(target: str) -> dict[str, Callable[[KazooClient], object]]:
    parent = target.rsplit("/", 1)[0]
    forged = f"{parent}/{target.rsplit('/', 1)[1]}-forged" if not target.endswith("-0") else target[:-2] + "-99"
    return {
        "read": lambda c: c.get(target),
        "set": lambda c: c.set(target, b'{"owner": "intruder", "epoch": 999999, "next_offset": 0}'),
        "create": lambda c: c.create(forged, b"forged"),
        "delete": lambda c: c.delete(target),
        "set-acl": lambda c: c.set_acls(target, OPEN_ACL_UNSAFE),
    }


TARGETS = ["config", "target-state", "assignment", "decision-log"]
OPS = ["read", "set", "create", "delete", "set-acl"]


def _assert_refused_and_unchanged(run: SecuredRun, owner_zk: KazooClient, intruder: ZkCredentials | None, target: str,
                                  op: str, refusal: type[Exception]) -> None:
    path = run.targets()[target]
    before = owner_zk.get(path)
    acl_before = owner_zk.get_acls(path)
    children_before = owner_zk.get_children(path.rsplit("/", 1)[0])
    c = _client(run.hosts, intruder, run.ca_file)
    try:
        with pytest.raises(refusal):
            _attacks(path)[op](c)
    finally:
        _close(c)
    after = owner_zk.get(path)
    assert after[0] == before[0] and after[1].version == before[1].version and after[1].mzxid == before[1].mzxid
    assert owner_zk.get_acls(path) == acl_before
    assert owner_zk.get_children(path.rsplit("/", 1)[0]) == children_before


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("target", TARGETS)
def test_client_without_credentials_is_refused_and_changes_nothing(secured_run, owner_zk, target, op):
    # The server enforces digest authentication: the first request of a session without it closes the session.
    _assert_refused_and_unchanged(secured_run, owner_zk, None, target, op, SessionClosedRequireSaslError)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("target", TARGETS)
def test_client_of_another_principal_is_refused_by_the_acls_and_changes_nothing(secured_run, owner_zk, target, op):
    # A user the server knows (its login succeeds): the ACLs alone refuse it.
    _assert_refused_and_unchanged(secured_run, owner_zk, secured_run.other, target, op, NoAuthError)


def test_shared_parent_lets_anyone_create_a_cluster_root_but_not_list_reacl_or_delete_a_cluster(secured_run):
    # ``/eosink`` itself is deletable only when empty (its parent ``/`` is ZooKeeper's, open): it never is.
    c = _client(secured_run.hosts, secured_run.other, secured_run.ca_file)
    try:
        for attack in (lambda: c.get_children(paths.ROOT), lambda: c.get(paths.ROOT),
                       lambda: c.set_acls(paths.ROOT, OPEN_ACL_UNSAFE), lambda: c.delete(secured_run.root),
                       lambda: c.get_children(secured_run.root)):
            with pytest.raises(NoAuthError):
                attack()
    finally:
        _close(c)


def test_worker_of_another_cluster_with_its_own_credentials_runs_beside_but_cannot_touch_the_first(
        secure_stack, secured_run, owner_zk, tmp_path):
    other = secured_run.other
    other_cluster = f"{secured_run.cluster}-other"
    env = _owner_env(other.password, other.user, secured_run.ca_file)
    # Its own cluster: its principal creates /eosink/<its cluster> beside the first one's, and its worker runs.
    init = cluster_init(other_cluster, env, secured_run.hosts)
    assert init.returncode == 0 and f"owned by sasl:{other.user}" in init.stdout, init.stderr
    w = WorkerProcess(secure_stack, other_cluster, "other-w1", tmp_path, extra_env=env)
    try:
        wait_until(lambda: w.proc.poll() is not None or '"worker_started"' in w.log_text(), 60, "the other cluster's worker")
        assert w.proc.poll() is None, w.log_text()[-2000:]
        c = _client(secured_run.hosts, other, secured_run.ca_file)
        try:
            assert c.exists(paths.worker(paths.cluster_root(other_cluster), "other-w1"))
        finally:
            _close(c)
    finally:
        assert w.stop() == 0
    for target in TARGETS:
        for op in OPS:
            _assert_refused_and_unchanged(secured_run, owner_zk, other, target, op, NoAuthError)
    # Pointed at the first cluster, with its own credentials: refused at start, one line.
    intruder = WorkerProcess(secure_stack, secured_run.cluster, "other-w2", tmp_path, extra_env=env)
    rc = intruder.wait(60)
    _assert_one_line(_log(intruder), rc, f"not authorized for {secured_run.root} as user {other.user}", other.password)


def _assert_one_line(log: str, rc: int, expect: str, secret: str) -> None:
    errors = [line for line in log.splitlines() if line.startswith("eosink: error:")]
    assert rc == 2, log[-2000:]
    assert len(errors) == 1 and "[zookeeper]" in errors[0] and expect in errors[0], log[-2000:]
    assert "EOSINK_ZOOKEEPER_PASSWORD" in errors[0]  # names the setting to fix
    assert "Traceback" not in log and secret not in log
    assert [line for line in log.splitlines() if not line.startswith("{")] == errors, "lines besides the error: " + log[-2000:]


def test_worker_with_a_wrong_password_exits_with_one_line_naming_zookeeper_the_path_and_the_setting(
        secure_stack, secured_run, tmp_path):
    wrong = secrets.token_urlsafe(24)
    w = WorkerProcess(secure_stack, secured_run.cluster, "wrong-pw", tmp_path, extra_env=_owner_env(wrong, "eosink", secured_run.ca_file))
    rc = w.wait(60)
    _assert_one_line(_log(w), rc, f"ZooKeeper at {secured_run.hosts} refused the login of user eosink", wrong)


def test_worker_without_credentials_exits_with_one_line_naming_zookeeper_and_the_setting(secure_stack, secured_run, tmp_path):
    # EOSINK_HOME of no stack: the secure stack's own credentials are not picked up as defaults.
    env = {**kafka_worker_env(), "EOSINK_HOME": str(tmp_path / "no-stack"), "EOSINK_ZOOKEEPER_USER": "", "EOSINK_ZOOKEEPER_PASSWORD": "",
           "EOSINK_ZOOKEEPER_CA_FILE": secured_run.ca_file}
    w = WorkerProcess(secure_stack, secured_run.cluster, "no-creds", tmp_path, extra_env=env)
    rc = w.wait(60)
    _assert_one_line(_log(w), rc, f"requires authentication and closed the session before {secured_run.root}",
                     secured_run.owner.password)


def test_cluster_tree_left_open_is_refused_until_taken_over_explicitly(secure_stack, secured_run, tmp_path):
    """A tree made by a run without credentials (world:anyone) is never adopted silently."""
    cluster = f"{secured_run.cluster}-open"
    root = paths.cluster_root(cluster)
    config = paths.connector_config(root, "left-open")
    # What a worker without credentials leaves: every znode open to anyone (made here on a session
    # of another principal, as the server admits no anonymous session).
    c = _client(secured_run.hosts, secured_run.other, secured_run.ca_file)
    try:
        for p in (root, paths.connectors(root), paths.connector(root, "left-open")):
            c.create(p, acl=OPEN_ACL_UNSAFE)  # not makepath: it asks exists("/eosink"), which nobody may
        c.create(config, b'{"connector.class": "filesystem"}', acl=OPEN_ACL_UNSAFE)
    finally:
        _close(c)
    env = _owner_env(secured_run.password_ref, "eosink", secured_run.ca_file)
    refused = WorkerProcess(secure_stack, cluster, "open-w1", tmp_path, extra_env=env)
    rc = refused.wait(60)
    log = _log(refused)
    errors = [line for line in log.splitlines() if line.startswith("eosink: error:")]
    assert rc == 2 and len(errors) == 1, log[-2000:]
    assert f"[zookeeper] {root} is open to anyone" in errors[0] and "--zookeeper-lock-open-tree" in errors[0]
    assert "Traceback" not in log
    # Taken over on request: the worker runs, and the tree is its principal's alone.
    w = WorkerProcess(secure_stack, cluster, "open-w2", tmp_path, extra_env=env, extra_args=["--zookeeper-lock-open-tree", "true"])
    try:
        wait_until(lambda: w.proc.poll() is not None or '"worker_started"' in w.log_text(), 60, "the worker taking over")
        assert w.proc.poll() is None, w.log_text()[-2000:]
        assert '"zookeeper_tree_locked"' in w.log_text()
    finally:
        assert w.stop() == 0
    intruder = _client(secured_run.hosts, secured_run.other, secured_run.ca_file)
    try:
        for attack in (lambda: intruder.get(config), lambda: intruder.set(config, b"{}"), lambda: intruder.delete(config),
                       lambda: intruder.set_acls(root, OPEN_ACL_UNSAFE)):
            with pytest.raises(NoAuthError):
                attack()
    finally:
        _close(intruder)
    # Now an ordinary worker (no take-over flag) starts on it.
    again = WorkerProcess(secure_stack, cluster, "open-w3", tmp_path, extra_env=env)
    try:
        wait_until(lambda: again.proc.poll() is not None or '"worker_started"' in again.log_text(), 60, "a worker on the locked tree")
        assert again.proc.poll() is None, again.log_text()[-2000:]
    finally:
        assert again.stop() == 0


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "eosink.worker.clients.cli", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def test_cli_direct_mode_writes_the_tree_only_with_the_owners_credentials(secured_run, owner_zk, tmp_path):
    config = tmp_path / "direct.json"
    config.write_text(json.dumps({"name": "direct", "config": {"connector.class": "filesystem", "topics": "t-none",
                                                               "file.path": str(tmp_path)}}))
    base = ["connectors", "--zookeeper", secured_run.hosts, "--cluster", secured_run.cluster]
    no_stack = {"EOSINK_HOME": str(tmp_path / "no-stack"), "EOSINK_ZOOKEEPER_CA_FILE": secured_run.ca_file}
    wrong = secrets.token_urlsafe(24)
    refused = _cli(*base, "apply", str(config), env={**no_stack, **_owner_env(wrong, "eosink", secured_run.ca_file)})
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and len(lines) == 1, refused.stderr
    assert f"[zookeeper] ZooKeeper at {secured_run.hosts} refused the login of user eosink" in lines[0]
    assert wrong not in refused.stderr
    assert not owner_zk.exists(paths.connector(secured_run.root, "direct"))
    # The owner's credentials, the password from a file holding a ${file:...} reference.
    password_file = tmp_path / "zk-password"
    password_file.write_text(secured_run.password_ref + "\n")
    applied = _cli(*base, "--zookeeper-user", "eosink", "--zookeeper-password-file", str(password_file), "apply", str(config),
                   env=no_stack)
    assert applied.returncode == 0, applied.stderr
    assert json.loads(owner_zk.get(paths.connector_config(secured_run.root, "direct"))[0])["topics"] == "t-none"
    listed = _cli(*base, "list", env={**no_stack, **_owner_env(secured_run.password_ref, "eosink", secured_run.ca_file)})
    assert listed.returncode == 0 and "direct" in listed.stdout.split(), listed.stderr
    owner_zk.delete(paths.connector(secured_run.root, "direct"), recursive=True)


def test_acls_keep_a_cluster_where_zookeeper_admits_anonymous_sessions_and_open_clusters_still_run_beside(stack, tmp_path):
    """The open stack's ZooKeeper enforces no authentication: the ACLs alone keep the tree (in a chroot of its own,
    so ``/eosink`` is made here, by a worker with credentials)."""
    chroot = f"/zkacl_{uuid.uuid4().hex[:8]}"
    plain = _client(stack.zookeeper_hosts)
    plain.create(chroot)
    _close(plain)
    hosts = f"{stack.zookeeper_hosts}{chroot}"
    owner = ZkCredentials("eosink-a", secrets.token_urlsafe(24), scheme="digest")  # this server has no SASL users
    session = ZkSession(hosts, "a", credentials=owner).start(create_root=True)
    try:
        from eosink.worker.control.store import ConnectorStore

        ConnectorStore(session).put("held", {"connector.class": "filesystem", "topics": "t-none", "file.path": str(tmp_path)})
        config = paths.connector_config(session.root, "held")
        before = session.client.get(config)
        # No credentials at all, on a server that lets the session in: every attempt refused by the ACLs.
        anonymous = _client(hosts)
        try:
            for attack in _attacks(config).values():
                with pytest.raises(NoAuthError):
                    attack(anonymous)
        finally:
            _close(anonymous)
        after = session.client.get(config)
        assert after[0] == before[0] and after[1].mzxid == before[1].mzxid
    finally:
        session.stop()
    # A worker without credentials is stopped with one line naming the path and the settings.
    w = WorkerProcess(stack, "a", "anon-w1", tmp_path, zookeeper=hosts, extra_env={"EOSINK_HOME": str(tmp_path / "no-stack")})
    rc = w.wait(60)
    _assert_one_line(_log(w), rc, "not authorized for /eosink/a without credentials", owner.password)
    # An open cluster still starts beside it, under the /eosink that admits nothing but creating a root.
    open_session = ZkSession(hosts, "b").start()
    try:
        assert open_session.client.get_acls(open_session.root)[0] == list(OPEN_ACL_UNSAFE)
    finally:
        open_session.stop()


def test_secure_zookeeper_refuses_plaintext_and_a_worker_without_tls_exits_with_one_line(secure_stack, secured_run, tmp_path):
    host, port = secured_run.hosts.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:  # a 4lw in plaintext: no answer
        s.sendall(b"ruok")
        s.shutdown(socket.SHUT_WR)
        try:
            answer = s.recv(4096)
        except OSError:
            answer = b""
    assert b"imok" not in answer
    plain = KazooClient(hosts=secured_run.hosts, **secured_run.owner.client_kwargs())
    with pytest.raises(KazooTimeoutError):
        plain.start(timeout=5)
    _close(plain)
    env = {**kafka_worker_env(), "EOSINK_HOME": str(tmp_path / "no-stack"), "EOSINK_ZOOKEEPER_USER": "eosink",
           "EOSINK_ZOOKEEPER_PASSWORD": secured_run.password_ref, "EOSINK_ZOOKEEPER_CA_FILE": ""}
    w = WorkerProcess(secure_stack, secured_run.cluster, "no-tls", tmp_path, extra_env=env)
    rc = w.wait(90)
    log = _log(w)
    errors = [line for line in log.splitlines() if line.startswith("eosink: error:")]
    assert rc == 2 and len(errors) == 1, log[-2000:]
    assert f"[zookeeper] cannot connect to ZooKeeper at {secured_run.hosts} without TLS" in errors[0]
    assert "--zookeeper-ca-file" in errors[0] and "Traceback" not in log


def test_worker_against_the_local_secure_stack_takes_its_zookeeper_credentials_and_tls_without_settings(
        secure_stack, secured_run, tmp_path):
    from tests.conftest import SECURE_HOME

    cluster = f"{secured_run.cluster}-defaults"
    env = {**kafka_worker_env(), "EOSINK_HOME": str(SECURE_HOME), "EOSINK_ZOOKEEPER_USER": "", "EOSINK_ZOOKEEPER_PASSWORD": "",
           "EOSINK_ZOOKEEPER_CA_FILE": ""}
    init = cluster_init(cluster, env)  # the stack's own address and principal, no settings either
    assert init.returncode == 0 and f"owned by sasl:{secured_run.owner.user}" in init.stdout, init.stderr
    w = WorkerProcess(secure_stack, cluster, "defaults-w1", tmp_path, extra_env=env)
    try:
        wait_until(lambda: w.proc.poll() is not None or '"worker_started"' in w.log_text(), 60, "the worker on the stack's defaults")
        assert w.proc.poll() is None, w.log_text()[-2000:]
    finally:
        assert w.stop() == 0
    owner = _client(secured_run.hosts, secured_run.owner, secured_run.ca_file)
    try:
        assert owner.get_acls(paths.cluster_root(cluster))[0] == secured_run.owner.acl
    finally:
        _close(owner)
    assert secured_run.owner.password not in _log(w)


def test_stack_super_user_can_repair_a_cluster_tree_that_no_other_principal_can_read(secured_run, secure_material):
    """The repair path the refusals point to: ZooKeeper's super user (``superUser``, a SASL user) passes every ACL."""
    config = secured_run.targets()["config"]
    root_user = ZkCredentials(secure_material.user("zookeeper.admin"), secure_material.password("zookeeper.admin"))
    c = _client(secured_run.hosts, root_user, secured_run.ca_file)
    try:
        assert json.loads(c.get(config)[0])["topics"] == secured_run.topic
        acls, stat = c.get_acls(config)
        c.set_acls(config, acls, version=stat.aversion)  # ADMIN: what a repair (setAcl) needs
    finally:
        _close(c)
    # The super user's name with another password never gets a session (see test_secure_zookeeper_login).
    impostor = ZkSession(secured_run.hosts, secured_run.cluster, credentials=ZkCredentials(root_user.user, secrets.token_urlsafe(16)),
                         ca_file=secured_run.ca_file)
    with pytest.raises(CoordinatorAuthError, match=f"refused the login of user {root_user.user}"):
        impostor.start()
