"""The secure stack's ZooKeeper checks passwords at login, and a cluster's root is made by ``eosink cluster init`` alone.

A wrong password (or a user the server's JAAS file does not know) never gets a session: not even
a znode that anyone may read answers it, where the right password reads it. eosink reports the
refusal in one line naming the ZooKeeper address and the principal. A worker with credentials that
finds no cluster root refuses to start and names ``eosink cluster init``; that command creates the
root once, the principal's alone, and says so when run again. A root made first by another
principal (squatted, shared with the cluster's own) is refused by both. Without credentials (the
open stack) the command makes the open root that workers there still make themselves.
"""

from __future__ import annotations

import secrets
import uuid
from pathlib import Path

import pytest
from kazoo.exceptions import ConnectionClosedError
from kazoo.protocol.states import KeeperState
from kazoo.security import ACL, OPEN_ACL_UNSAFE, Id, Permissions

from eosink.worker import paths
from eosink.worker.engine.zk import CoordinatorAuthError, ZkCredentials, ZkSession, kazoo_client
from tests.conftest import kafka_worker_env
from tests.procs import WorkerProcess, cluster_init, wait_until

pytestmark = pytest.mark.secure

#: ZooKeeper's own znode, readable by anyone who has a session (its ACL is world:anyone).
WORLD_READABLE = "/zookeeper"


def _owner(material) -> ZkCredentials:
    return ZkCredentials(material.user("zookeeper"), material.password("zookeeper"))


def _super(material) -> ZkCredentials:
    return ZkCredentials(material.user("zookeeper.admin"), material.password("zookeeper.admin"))


def _exists(stack, material, path: str) -> bool:
    """Whether ``path`` exists, asked as ZooKeeper's super user (no ACL hides it from the answer)."""
    c = kazoo_client(stack.zookeeper_hosts, _super(material), str(material.ca_cert))
    c.start(timeout=20)
    try:
        return c.exists(path) is not None
    finally:
        c.stop()
        c.close()


def _one_error_line(text: str) -> str:
    errors = [line for line in text.splitlines() if line.startswith("eosink: error:")]
    assert len(errors) == 1 and "[zookeeper]" in errors[0], text[-2000:]
    assert "Traceback" not in text, text[-2000:]
    return errors[0]


@pytest.mark.parametrize("who", ["the cluster's user", "a user the server does not know"])
def test_wrong_zookeeper_password_is_refused_at_the_session(secure_stack, secure_material, who):
    ca = str(secure_material.ca_cert)
    owner = _owner(secure_material)
    right = kazoo_client(secure_stack.zookeeper_hosts, owner, ca)
    right.start(timeout=20)
    try:
        assert right.get(WORLD_READABLE) is not None  # the control: any session may read it
    finally:
        right.stop()
        right.close()
    user = owner.user if who == "the cluster's user" else f"nobody-{uuid.uuid4().hex[:6]}"
    wrong = kazoo_client(secure_stack.zookeeper_hosts, ZkCredentials(user, secrets.token_urlsafe(16)), ca)
    states: list[str] = []
    record = wrong._session_callback  # kazoo's session states (KeeperState), which no public listener reports

    def observe(state: str) -> None:
        states.append(state)
        record(state)

    wrong._session_callback = observe
    wrong.start_async()
    try:
        wait_until(lambda: KeeperState.CLOSED in states, 30, "the client to give the session up")
        assert KeeperState.AUTH_FAILED in states, states  # the login, not a lost connection
        assert states[-1] == KeeperState.CLOSED and not wrong.connected  # and no retry
        with pytest.raises(ConnectionClosedError):
            wrong.get(WORLD_READABLE)  # no ACL forbids it: there is no session to ask with
    finally:
        wrong.stop()
        wrong.close()
    # eosink's own session says so, naming the server and the principal.
    session = ZkSession(secure_stack.zookeeper_hosts, "default", credentials=ZkCredentials(user, secrets.token_urlsafe(16)),
                        ca_file=ca)
    with pytest.raises(CoordinatorAuthError) as refused:
        session.start()
    assert f"ZooKeeper at {secure_stack.zookeeper_hosts} refused the login of user {user}" in str(refused.value)


def test_cluster_init_with_a_wrong_password_exits_with_one_line_naming_zookeeper_and_the_principal(
        secure_stack, secure_material, secure_zookeeper_env):
    cluster = f"init-wrong-{uuid.uuid4().hex[:8]}"
    wrong = secrets.token_urlsafe(24)
    done = cluster_init(cluster, {**secure_zookeeper_env, "EOSINK_ZOOKEEPER_PASSWORD": wrong}, secure_stack.zookeeper_hosts)
    assert done.returncode == 2, done.stderr
    line = _one_error_line(done.stderr)
    assert f"ZooKeeper at {secure_stack.zookeeper_hosts} refused the login of user eosink" in line
    assert "EOSINK_ZOOKEEPER_PASSWORD" in line and wrong not in done.stderr + done.stdout
    assert not _exists(secure_stack, secure_material, paths.cluster_root(cluster))


def test_worker_refuses_to_create_the_cluster_root_on_the_secure_stack(
        secure_stack, secure_material, secure_zookeeper_env, tmp_path):
    cluster = f"no-root-{uuid.uuid4().hex[:8]}"
    w = WorkerProcess(secure_stack, cluster, "no-root-w1", tmp_path, extra_env={**secure_zookeeper_env, **kafka_worker_env()})
    rc = w.wait(60)
    log = w.log_path.read_text(errors="replace")
    assert rc == 2, log[-2000:]
    line = _one_error_line(log)
    assert f"has no {paths.cluster_root(cluster)}: run `eosink cluster init --cluster {cluster}`" in line
    assert not _exists(secure_stack, secure_material, paths.cluster_root(cluster))


def test_cluster_init_creates_the_root_once_as_the_principals_alone_and_then_a_worker_starts(
        secure_stack, secure_material, secure_zookeeper_env, tmp_path):
    cluster = f"init-{uuid.uuid4().hex[:8]}"
    root = paths.cluster_root(cluster)
    first = cluster_init(cluster, secure_zookeeper_env, secure_stack.zookeeper_hosts)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == (f"cluster {cluster}: {root} created owned by sasl:eosink "
                                    f"(ZooKeeper at {secure_stack.zookeeper_hosts})")
    again = cluster_init(cluster, secure_zookeeper_env, secure_stack.zookeeper_hosts)
    assert again.returncode == 0 and "already exists, owned by sasl:eosink" in again.stdout, again.stderr
    c = kazoo_client(secure_stack.zookeeper_hosts, _owner(secure_material), str(secure_material.ca_cert))
    c.start(timeout=20)
    try:
        assert c.get_acls(root)[0] == [ACL(Permissions.ALL, Id("sasl", "eosink"))]
    finally:
        c.stop()
        c.close()
    w = WorkerProcess(secure_stack, cluster, "init-w1", tmp_path, extra_env={**secure_zookeeper_env, **kafka_worker_env()})
    try:
        wait_until(lambda: w.proc.poll() is not None or '"worker_started"' in w.log_text(), 60, "the worker on the new root")
        assert w.proc.poll() is None, w.log_text()[-2000:]
    finally:
        assert w.stop() == 0


def test_cluster_root_squatted_by_another_principal_is_refused_by_init_and_by_workers(
        secure_stack, secure_material, secure_zookeeper_env, tmp_path: Path):
    cluster = f"squat-{uuid.uuid4().hex[:8]}"
    root = paths.cluster_root(cluster)
    other = ZkCredentials(secure_material.user("zookeeper.other"), secure_material.password("zookeeper.other"))
    # Another principal gets there first and shares the root with the cluster's own, so its workers would use it.
    squatter = kazoo_client(secure_stack.zookeeper_hosts, other, str(secure_material.ca_cert))
    squatter.start(timeout=20)
    try:
        shared = other.acl + [ACL(Permissions.ALL, Id("sasl", "eosink"))]
        squatter.create(root, acl=shared)
        squatter.create(paths.connectors(root), acl=shared)
    finally:
        squatter.stop()
        squatter.close()
    init = cluster_init(cluster, secure_zookeeper_env, secure_stack.zookeeper_hosts)
    assert init.returncode == 2, init.stderr
    assert f"{root} also admits sasl:{other.user} besides sasl:eosink" in _one_error_line(init.stderr)
    w = WorkerProcess(secure_stack, cluster, "squat-w1", tmp_path, extra_env={**secure_zookeeper_env, **kafka_worker_env()})
    rc = w.wait(60)
    log = w.log_path.read_text(errors="replace")
    assert rc == 2, log[-2000:]
    assert f"{root} also admits sasl:{other.user}" in _one_error_line(log)
    assert '"worker_started"' not in log


def test_cluster_init_without_credentials_makes_the_open_root_an_open_stacks_workers_make_themselves(stack, tmp_path):
    cluster = f"open-init-{uuid.uuid4().hex[:8]}"
    env = {"EOSINK_HOME": str(tmp_path / "no-stack"), "EOSINK_ZOOKEEPER_USER": "", "EOSINK_ZOOKEEPER_PASSWORD": ""}
    done = cluster_init(cluster, env, stack.zookeeper_hosts)
    assert done.returncode == 0, done.stderr
    assert f"{paths.cluster_root(cluster)} created owned by world:anyone (no credentials)" in done.stdout
    session = ZkSession(stack.zookeeper_hosts, cluster).start()  # what an open worker starts with: no refusal
    try:
        assert session.client.get_acls(session.root)[0] == list(OPEN_ACL_UNSAFE)
    finally:
        session.stop()
