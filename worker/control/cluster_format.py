"""The format of a cluster's ZooKeeper tree, claimed by every worker as it starts.

``/eosink/<cluster>/format`` holds ``{"format": N, "written_by": "<version>"}``: the format of
everything in the tree (decision log, assignments, status, configs). A worker that finds a format
newer than it reads refuses to start (:class:`~eosink.connectors.api.formats.NewerFormatError`)
rather than misread the tree, e.g. a worker of an older release started by mistake after the
cluster moved on. A tree without the node was made by a release before formats: format 1, and the
first worker of this release to start writes the node. A release that changes the tree's format
raises the node only once every worker runs it (docs/operations/upgrades.md).
"""

from __future__ import annotations

import json
from typing import Any

from eosink.connectors.api import formats
from eosink.worker import paths
from eosink.worker.version import VERSION


def claim(client: Any, root: str, hosts: str) -> int:
    """The tree's format (writing the node when absent); refuses one newer than this release reads."""
    from kazoo.exceptions import NodeExistsError, NoNodeError

    path = paths.cluster_format(root)
    try:
        data, _ = client.get(path)
    except NoNodeError:
        try:
            client.create(path, json.dumps({formats.KEY: formats.ZOOKEEPER, "written_by": VERSION}).encode())
            return formats.ZOOKEEPER
        except NodeExistsError:
            data, _ = client.get(path)
    try:
        found = formats.version_of(json.loads(data))
    except ValueError:
        found = formats.UNREADABLE
    formats.check(found, formats.ZOOKEEPER, "the cluster's ZooKeeper tree", f"ZooKeeper {hosts}{path}", component="zookeeper")
    return found
