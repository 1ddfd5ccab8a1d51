"""``eosink cluster init``: create a cluster's root in ZooKeeper, once, as the cluster's principal.

Run by an operator before the cluster's first worker starts. It creates ``/eosink`` (anyone may
create a cluster root under it, nothing else) and ``/eosink/<cluster>`` with an ACL that gives the
principal of the settings (``--zookeeper-user``; the local secure stack's by default) every
permission and nobody else any. Workers with credentials never create that root: one that finds
none refuses to start and names this command. Idempotent: a root that exists and is the
principal's alone is reported and kept; one that admits anybody else is refused (see
:mod:`eosink.worker.engine.zk`). Without credentials it creates an open root, as an open stack's
workers do by themselves.
"""

from __future__ import annotations

import argparse
from typing import Any

from eosink.connectors.api.errors import EosinkError
from eosink.worker.clients import typed
from eosink.worker.clients.typed import setting


def add_parser(sub: Any, cluster_args: Any) -> None:
    c = sub.add_parser("cluster", help="a cluster's ZooKeeper tree: init", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    a = c.add_subparsers(dest="action", required=True)
    p = a.add_parser("init", help="create /eosink/<cluster> with its ACLs, as the cluster's principal (once, idempotent)")
    cluster_args(p)
    setting(p, "--timeout", kind=typed.DURATION, default="30", help="how long to wait for ZooKeeper (30, 10s, 1m)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from eosink.worker.clients import zk_auth
    from eosink.worker.engine.zk import ZkSession

    if not args.zookeeper:
        raise EosinkError("no ZooKeeper hosts: pass --zookeeper or set EOSINK_ZOOKEEPER (or start the local stack: "
                          "eosink stack up)", component="cli")
    creds = zk_auth.credentials(args)
    session = ZkSession(args.zookeeper, args.cluster, credentials=creds, ca_file=zk_auth.ca_file(args))
    session.start(timeout=float(args.timeout), lock_open_tree=args.zookeeper_lock_open_tree == "true", create_root=True)
    try:
        owner = f"{creds.scheme}:{creds.user}" if creds else "world:anyone (no credentials)"
        state = "created" if session.created_root else "already exists,"
        print(f"cluster {args.cluster}: {session.root} {state} owned by {owner} (ZooKeeper at {args.zookeeper})")
    finally:
        session.stop()
    return 0
