"""A ZooKeeper ensemble of 3 (or 5) nodes on loopback, beside the single-node default.

``eosink stack up --zookeeper-nodes 3`` (or ``EOSINK_ZOOKEEPER_NODES=3``) runs three ZooKeeper servers
(``QuorumPeerMain``, one JVM each), every one its own component: ``zookeeper`` (node 1), ``zookeeper-2``
and ``zookeeper-3``, each with its own data dir (and ``myid`` file), log and pid file, so a test can
SIGKILL one node and start it again with the stack's own code. One node (the default) stays exactly
the standalone server of :mod:`zookeeper`.

Ports, from ``EOSINK_ZOOKEEPER_PORT`` (``P``, default 12181), for node ``i`` (1-based):

* clients: ``P + (i-1)``, by default 12181, 12182, 12183;
* quorum (followers to the leader): ``P + 10 + (i-1)``, by default 12191, 12192, 12193;
* leader election: ``P + 20 + (i-1)``, by default 12201, 12202, 12203;

so the client ports are contiguous and node 1 keeps the single node's port. endpoints.json's
``zookeeper.hosts`` lists every client address (``127.0.0.1:12181,127.0.0.1:12182,127.0.0.1:12183``):
kazoo, the workers and the CLI take such a connect string as it is, and move a session to another
node when theirs goes away.

The node count comes from the flag, else the env var, else ``<stack>/zookeeper/nodes`` written by the
last ``up``, else 1; a home whose node 1 already holds data refuses another count (the data was
written by a server of that count). A secure stack runs one node only: the quorum links between
nodes would carry the tree unencrypted.
"""

from __future__ import annotations

import socket
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

from eosink.worker.stack.components.zookeeper import PORT_ENV, ZooKeeper
from eosink.worker.stack.errors import StackError
from eosink.worker.stack.layout import HOST, StackLayout, count_from_env, read_count, write_count

NODES_ENV = "EOSINK_ZOOKEEPER_NODES"
COUNTS = (1, 3, 5)
QUORUM_OFFSET = 10
ELECTION_OFFSET = 20


def node_count(layout: StackLayout, requested: int | None = None) -> int:
    """The count to act on: the argument, else ``EOSINK_ZOOKEEPER_NODES``, else the recorded count, else 1."""
    if requested is None:
        requested = count_from_env(NODES_ENV, "ZooKeeper nodes")
    if requested is None:
        return recorded_count(layout) or 1
    if requested not in COUNTS:
        raise StackError(f"--zookeeper-nodes/{NODES_ENV}={requested}: choose {', '.join(map(str, COUNTS))} "
                         "(an even count survives no more failures than one node fewer)")
    if requested > 1 and layout.secure:
        raise StackError(f"--zookeeper-nodes/{NODES_ENV}={requested}: a secure stack runs one ZooKeeper node (the quorum "
                         "links between nodes would carry the tree unencrypted); use an open stack for an ensemble")
    return requested


def count_file(layout: StackLayout) -> Path:
    return layout.data_dir(ZooKeeper.name) / "nodes"


def recorded_count(layout: StackLayout) -> int | None:
    return read_count(count_file(layout))


def record_count(layout: StackLayout, count: int) -> None:
    """Remember the count; refuse to change it once node 1 holds data written by another count.

    A home that never ran an ensemble gets no file: its absence means one node, so a single-node
    stack's files stay exactly as they were."""
    recorded = recorded_count(layout)
    if recorded is None and count == 1:
        return
    previous = recorded or 1
    has_data = (layout.data_dir(ZooKeeper.name) / "data" / "version-2").exists()
    if has_data and previous != count:
        raise StackError(
            f"the ZooKeeper under {layout.data_dir(ZooKeeper.name)} holds data of {previous} node(s), not {count}; "
            f"run `eosink stack down`, remove {layout.root}/zookeeper*, and `eosink stack up --zookeeper-nodes {count}` "
            "(or use another EOSINK_HOME)")
    write_count(count_file(layout), count)


def client_port(layout: StackLayout, node: int) -> int:
    return layout.port(PORT_ENV) + node - 1


def quorum_port(layout: StackLayout, node: int) -> int:
    return layout.port(PORT_ENV) + QUORUM_OFFSET + node - 1


def election_port(layout: StackLayout, node: int) -> int:
    return layout.port(PORT_ENV) + ELECTION_OFFSET + node - 1


def connect_string(layout: StackLayout, nodes: int) -> str:
    """Every node's client address, comma-separated: what kazoo and ``--zookeeper`` take."""
    return ",".join(f"{HOST}:{client_port(layout, n)}" for n in range(1, nodes + 1))


def ask(port: int, command: bytes, timeout: float = 2.0) -> bytes:
    """A four-letter word sent to the node on ``port`` (plaintext), and its whole answer."""
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(command)
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
    return answer


class EnsembleNode(ZooKeeper):
    """Node ``node_id`` of an ensemble of ``nodes`` (``QuorumPeerMain``); :func:`node_class` makes them."""

    node_id: ClassVar[int] = 1
    main_class = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
    ready_timeout_s = 60.0  # the nodes wait for each other: a leader needs a majority

    def __init__(self, layout: StackLayout, nodes: int) -> None:
        super().__init__(layout)
        self.nodes = nodes

    @property
    def myid_file(self) -> Path:
        return self.data_dir / "data" / "myid"

    def ports(self) -> dict[str, int]:
        n = self.node_id
        return {f"{PORT_ENV} (node {n} client port, base+{n - 1})": client_port(self.layout, n),
                f"{PORT_ENV} (node {n} quorum port, base+{QUORUM_OFFSET + n - 1})": quorum_port(self.layout, n),
                f"{PORT_ENV} (node {n} election port, base+{ELECTION_OFFSET + n - 1})": election_port(self.layout, n)}

    def endpoint(self) -> dict[str, Any]:
        return {"hosts": connect_string(self.layout, self.nodes), "nodes": self.nodes}

    def address(self) -> str:
        return f"{HOST}:{client_port(self.layout, self.node_id)}"

    def launch(self) -> int:
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        self.myid_file.write_text(f"{self.node_id}\n")
        return super().launch()

    def _listener(self) -> list[str]:
        return [f"clientPortAddress={HOST}", f"clientPort={client_port(self.layout, self.node_id)}"]

    def _config(self) -> str:
        # initLimit/syncLimit in ticks of 500 ms: a follower that hears nothing from its leader for
        # syncLimit ticks (2 s) drops it and starts an election, well inside a worker's session timeout.
        servers = [f"server.{n}={HOST}:{quorum_port(self.layout, n)}:{election_port(self.layout, n)}"
                   for n in range(1, self.nodes + 1)]
        return super()._config() + "\n".join(["initLimit=10", "syncLimit=4", "cnxTimeout=2000", *servers, ""])

    def probe(self) -> None:
        port = client_port(self.layout, self.node_id)
        answer = ask(port, b"srvr")
        if b"Mode: leader" not in answer and b"Mode: follower" not in answer:
            raise RuntimeError(f"`srvr` on {HOST}:{port} answered {answer[:120]!r}: node {self.node_id} is in no quorum yet")

    def mode(self) -> str | None:
        """``leader`` or ``follower`` while the node serves in a quorum; None otherwise (down, or electing)."""
        try:
            answer = ask(client_port(self.layout, self.node_id), b"srvr").decode(errors="replace")
        except OSError:
            return None
        for line in answer.splitlines():
            if line.startswith("Mode: "):
                return line.removeprefix("Mode: ").strip()
        return None


@cache
def node_class(node: int) -> type[EnsembleNode]:
    """The component class of ensemble node ``node``: named ``zookeeper`` for 1, ``zookeeper-<n>`` otherwise."""
    name = ZooKeeper.name if node == 1 else f"{ZooKeeper.name}-{node}"
    return type(f"ZooKeeperNode{node}", (EnsembleNode,), {"name": name, "node_id": node,
                                                          "__doc__": f"Node {node} of a ZooKeeper ensemble."})


def nodes(layout: StackLayout, count: int | None = None) -> list[ZooKeeper]:
    """The stack's ZooKeeper servers: the standalone one, or every ensemble node (node 1 first)."""
    total = node_count(layout, count)
    if total == 1:
        return [ZooKeeper(layout)]
    return [node_class(n)(layout, total) for n in range(1, total + 1)]
