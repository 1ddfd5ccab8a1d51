"""Every ZooKeeper path eosink uses, in one place.

The tree of one cluster (``/eosink/<cluster>``)::

    format                                 the format of this tree: {format, written_by}
    workers/<worker-id>                    ephemeral: host, REST url, started
    leader/n_<seq>                         election: the lowest sequence leads
    connectors/<name>/config               JSON config; the znode version is the config generation
    connectors/<name>/target-state         RUNNING | PAUSED | STOPPED
    connectors/<name>/restart              a pending restart request
    assignments/<worker-id>                what the leader gave this worker
    status/<name>/<worker-id>              each worker's task report for a connector
    partitions/<name>/<topic>-<p>          the decision log: {owner, epoch, next_offset, txn}
    generations/<name>/g-<seq>             ephemeral sequence: a task's generation (txn ids)
    deadletter/<name>/<txn>                dead-letter manifests of prepared cycles

The engine and the control plane both read and write this tree; keeping the layout here means
a reader finds every path in one file, and a change of layout is one change.
"""

from __future__ import annotations

from eosink.connectors.api.records import TopicPartition

#: The parent of every cluster's tree; shared by the clusters, so its ACL lets each create its root
#: and nothing else (:mod:`eosink.worker.engine.zk`).
ROOT = "/eosink"


def cluster_root(cluster: str) -> str:
    return f"{ROOT}/{cluster}"


def workers(root: str) -> str:
    return f"{root}/workers"


def worker(root: str, worker_id: str) -> str:
    return f"{root}/workers/{worker_id}"


def leader(root: str) -> str:
    return f"{root}/leader"


def leader_candidate(root: str) -> str:
    """The prefix of a worker's ephemeral sequence znode in the election (ZooKeeper appends the sequence)."""
    return f"{root}/leader/n_"


def connectors(root: str) -> str:
    return f"{root}/connectors"


def connector(root: str, name: str) -> str:
    return f"{root}/connectors/{name}"


def connector_config(root: str, name: str) -> str:
    return f"{root}/connectors/{name}/config"


def target_state(root: str, name: str) -> str:
    return f"{root}/connectors/{name}/target-state"


def restart_request(root: str, name: str) -> str:
    return f"{root}/connectors/{name}/restart"


def assignments(root: str) -> str:
    return f"{root}/assignments"


def assignment(root: str, worker_id: str) -> str:
    return f"{root}/assignments/{worker_id}"


def status(root: str, name: str) -> str:
    return f"{root}/status/{name}"


def task_status(root: str, name: str, worker_id: str) -> str:
    return f"{root}/status/{name}/{worker_id}"


def partitions(root: str, name: str) -> str:
    return f"{root}/partitions/{name}"


def partition(root: str, name: str, tp: TopicPartition) -> str:
    return f"{root}/partitions/{name}/{tp.topic}-{tp.partition}"


def parse_partition(child: str) -> TopicPartition | None:
    """The partition a decision-log child names (``<topic>-<p>``), or None for anything else."""
    topic, sep, part = child.rpartition("-")
    return TopicPartition(topic, int(part)) if sep and topic and part.isdigit() else None


def generations(root: str, name: str) -> str:
    return f"{root}/generations/{name}"


def deadletter(root: str, name: str) -> str:
    return f"{root}/deadletter/{name}"


def cluster_format(root: str) -> str:
    """The format of everything in the cluster's tree (:mod:`eosink.worker.control.cluster_format`)."""
    return f"{root}/format"
