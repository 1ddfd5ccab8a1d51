"""``--zookeeper-nodes`` / ``EOSINK_ZOOKEEPER_NODES`` without starting a server: which counts are taken,
which homes refuse them (naming the setting and what to do), and what each node's zoo.cfg says."""

from __future__ import annotations

import pytest

from eosink.worker.stack import manager
from eosink.worker.stack.components import zookeeper_ensemble
from eosink.worker.stack.components.zookeeper import ZooKeeper
from eosink.worker.stack.errors import StackError
from eosink.worker.stack.layout import StackLayout


@pytest.fixture
def layout(tmp_path, monkeypatch) -> StackLayout:
    monkeypatch.delenv("EOSINK_ZOOKEEPER_NODES", raising=False)
    monkeypatch.setenv("EOSINK_ZOOKEEPER_PORT", "40181")
    return StackLayout.for_home(tmp_path / "home")


def test_one_node_by_default_is_the_standalone_server_on_its_port(layout):
    [zk] = manager.select(["zookeeper"], layout)
    assert type(zk) is ZooKeeper and zk.main_class.endswith("ZooKeeperServerMain")
    assert zk.endpoint() == {"hosts": "127.0.0.1:40181"}


@pytest.mark.parametrize("count", [2, 4, 0, 9])
def test_a_count_other_than_1_3_5_is_refused_naming_the_setting(layout, count):
    with pytest.raises(StackError, match=rf"--zookeeper-nodes/EOSINK_ZOOKEEPER_NODES={count}: choose 1, 3, 5"):
        zookeeper_ensemble.node_count(layout, count)


def test_a_count_that_is_not_a_number_is_refused_quoting_it(layout, monkeypatch):
    monkeypatch.setenv("EOSINK_ZOOKEEPER_NODES", "three")
    with pytest.raises(StackError, match="EOSINK_ZOOKEEPER_NODES='three' is not a whole number of ZooKeeper nodes"):
        manager.select(["zookeeper"], layout)


def test_a_secure_stack_refuses_an_ensemble(tmp_path):
    secure = StackLayout(tmp_path / "home", secure=True)
    with pytest.raises(StackError, match="a secure stack runs one ZooKeeper node"):
        zookeeper_ensemble.node_count(secure, 3)


def test_three_nodes_each_with_its_ports_myid_and_every_server_line(layout):
    nodes = manager.select(["zookeeper"], layout, zookeeper_nodes=3)
    assert [n.name for n in nodes] == ["zookeeper", "zookeeper-2", "zookeeper-3"]
    assert {n.endpoint()["hosts"] for n in nodes} == {"127.0.0.1:40181,127.0.0.1:40182,127.0.0.1:40183"}
    assert sorted(manager.select(["zookeeper-2"], layout, zookeeper_nodes=3)[0].ports().values()) == [40182, 40192, 40202]
    config = nodes[1]._config()
    assert "clientPort=40182" in config and nodes[1].main_class.endswith("QuorumPeerMain")
    for n in (1, 2, 3):
        assert f"server.{n}=127.0.0.1:{40190 + n}:{40200 + n}" in config


def test_a_home_with_data_of_one_node_refuses_three_and_says_what_to_remove(layout):
    (layout.data_dir("zookeeper") / "data" / "version-2").mkdir(parents=True)
    with pytest.raises(StackError, match=r"holds data of 1 node\(s\), not 3; run `eosink stack down`, remove .*zookeeper\*"):
        zookeeper_ensemble.record_count(layout, 3)
    zookeeper_ensemble.record_count(layout, 1)  # the same count is fine, and a single node records nothing
    assert not zookeeper_ensemble.count_file(layout).exists()


def test_the_recorded_count_is_what_later_commands_act_on(layout):
    zookeeper_ensemble.record_count(layout, 3)
    assert [n.name for n in manager.select(None, layout) if n.name.startswith("zookeeper")] == \
        ["zookeeper", "zookeeper-2", "zookeeper-3"]
    with pytest.raises(StackError, match="unknown component"):
        manager.select(["zookeeper-4"], layout)
