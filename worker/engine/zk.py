"""One kazoo session per worker, and what its connection state means for deciding.

kazoo reports SUSPENDED when the connection drops and LOST only once the server says the
session expired - which a client cut off from the server may not hear until it reconnects
(measured with kazoo). So: on SUSPENDED stop deciding at once; once a full session timeout has passed
on the local clock since the suspension, treat every partition as lost (``session_probably_lost``).

**Credentials.** With :class:`ZkCredentials` the session authenticates as a principal, and every znode
it creates gets an ACL that gives that principal alone every permission: nobody else may read
(configs may hold secrets) or write (the decision log is the commit point) the cluster's tree.
Two schemes: ``sasl`` (SASL DIGEST-MD5, kazoo's ``sasl_options``: the server checks the password at
login and closes the session of a wrong one) and ``digest`` (the password is not checked, the ACLs
alone refuse a wrong one; for a ZooKeeper without a JAAS file). Give a ``ca_file`` too, for TLS.
The ACLs of the tree:

``/eosink``                    ``world:anyone`` CREATE only: each cluster, under its own principal,
                               creates ``/eosink/<cluster>`` beside the others; nobody may delete,
                               list, or re-ACL it (only ZooKeeper's super user can);
``/eosink/<cluster>`` and all  ``<scheme>:<user>`` ALL, nothing for anyone else.
below

**The cluster root** is created once, by ``eosink cluster init`` (:func:`ZkSession.start` with
``create_root=True``), as the cluster's principal. A worker with credentials never creates it: one
that finds no root refuses to start and names that command, so a typo'd cluster name or a worker
started before the operator cannot make a tree. A root whose ACL admits anyone besides the principal
(made by someone else first: squatted) is refused. A root that ``world:anyone`` may use (left by a run
without credentials) is refused too: whatever is in it may have been written by anyone, so a worker
never adopts it silently; :func:`lock_open_tree_acls` takes it over when an operator asks for it
explicitly. Without credentials (the open stack) a session creates the open root as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kazoo import security
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import AuthFailedError, NoAuthError, NodeExistsError, NoNodeError, SessionClosedRequireSaslError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry
from kazoo.security import ACL, ANYONE_ID_UNSAFE, OPEN_ACL_UNSAFE, Permissions, make_digest_acl

from eosink.connectors.api.errors import CoordinatorUnavailableError, FatalError
from eosink.worker import paths
from eosink.worker.logging import get_logger

log = get_logger("eosink.worker.engine.zk")

#: Where the credentials come from, as an error names them.
CREDENTIAL_SETTINGS = "--zookeeper-user / EOSINK_ZOOKEEPER_USER and EOSINK_ZOOKEEPER_PASSWORD or --zookeeper-password-file"

#: What creates a cluster's root when its workers have credentials.
INIT_COMMAND = "eosink cluster init"

#: Authentication schemes of :class:`ZkCredentials`.
SCHEMES = ("sasl", "digest")

#: ``/eosink``'s ACL: anyone may create a cluster root under it, nothing else (see the module docstring).
TOP_ACL = [ACL(Permissions.CREATE, ANYONE_ID_UNSAFE)]


class _StartLogger(logging.LoggerAdapter):
    """kazoo's logger, muted until the session is started and allowed into the cluster's tree.

    A refused start (no credentials, a server that is away) is reported as one error; kazoo's own
    lines about the connection the server closed would only bury it.
    """

    quiet = True

    def log(self, level: int, msg: object, *args: object, **kwargs: object) -> None:
        if not self.quiet:
            super().log(level, msg, *args, **kwargs)  # type: ignore[arg-type]


class CoordinatorAuthError(FatalError):
    """ZooKeeper refused this process's identity for the cluster's tree (no credentials against a server or
    tree that requires them, a wrong password, or a tree owned by another principal): an operator fixes
    the settings; retrying cannot help."""


class OpenTreeError(FatalError):
    """The cluster's tree is open to anyone (made by a run without credentials): refused until an operator
    takes it over (:func:`lock_open_tree_acls`) or removes it."""


class ClusterRootMissingError(FatalError):
    """The cluster's root does not exist and this process may not create it: an operator runs ``eosink cluster init``."""


class ClusterRootForeignError(FatalError):
    """The cluster's root admits a principal besides the cluster's own: made by someone else first."""


@dataclass(frozen=True)
class ZkCredentials:
    """A principal: ``user`` and ``password`` (never shown: ``repr`` hides it), authenticated with ``scheme``
    (``sasl``: SASL DIGEST-MD5, checked at login; ``digest``: not checked, the ACLs decide)."""

    user: str
    password: str = field(repr=False)
    scheme: str = "sasl"

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"ZooKeeper authentication scheme {self.scheme!r}: expected one of {', '.join(SCHEMES)}")

    @property
    def auth_data(self) -> list[tuple[str, str]]:
        """``addauth`` pairs: the digest scheme's (SASL authenticates in :attr:`sasl_options` instead)."""
        return [("digest", f"{self.user}:{self.password}")] if self.scheme == "digest" else []

    @property
    def sasl_options(self) -> dict[str, str] | None:
        """kazoo's ``sasl_options`` for SASL DIGEST-MD5 (needs ``pure-sasl``); None for the digest scheme."""
        if self.scheme != "sasl":
            return None
        return {"mechanism": "DIGEST-MD5", "username": self.user, "password": self.password}

    @property
    def acl(self) -> list[ACL]:
        """Every permission for this principal, none for anyone else."""
        if self.scheme == "sasl":
            return [security.make_acl("sasl", self.user, all=True)]
        return [make_digest_acl(self.user, self.password, all=True)]

    def login_kwargs(self) -> dict[str, Any]:
        """What a KazooClient needs to authenticate as this principal."""
        return {"auth_data": self.auth_data or None, "sasl_options": self.sasl_options}

    def client_kwargs(self) -> dict[str, Any]:
        """What a KazooClient needs to authenticate as this principal and create znodes only it may use."""
        return {**self.login_kwargs(), "default_acl": self.acl}


class ZkSession:
    """A started KazooClient rooted at ``/eosink/<cluster>``, with a decide gate."""

    timeout_exception = KazooTimeoutError

    def __init__(self, hosts: str, cluster: str = "default", session_timeout: float = 10.0,
                 credentials: ZkCredentials | None = None, ca_file: str | None = None) -> None:
        """``ca_file``: connect over TLS, verifying the server's certificate and host name against this CA."""
        self.root = paths.cluster_root(cluster)
        self.session_timeout = session_timeout
        self.request_timeout = max(2.0, session_timeout / 2)
        self.credentials = credentials
        self.created_root = False  # set by start(): whether it created the cluster's root
        self.hosts = hosts
        self._kazoo_log = _StartLogger(logging.getLogger("kazoo.client"), {})
        # kazoo authenticates (SASL, or addauth for digest) right after every (re)connect, before any request:
        # a server that enforces authentication never sees an unauthenticated request from this client.
        self.client = KazooClient(hosts=hosts, timeout=session_timeout,
                                  **(credentials.login_kwargs() if credentials else {}),
                                  default_acl=credentials.acl if credentials else None, logger=self._kazoo_log,
                                  use_ssl=ca_file is not None, ca=ca_file, verify_certs=True, check_hostname=ca_file is not None,
                                  connection_retry=connection_retry())
        self.ca_file = ca_file
        self._state = KazooState.LOST
        self._suspended_at: float | None = None
        self._lock = threading.Lock()
        self._stopping = False
        self._on_reconnect: list[Callable[[], None]] = []
        self.client.add_listener(self._on_state)
        self._login_failed = threading.Event()
        if credentials is not None and credentials.scheme == "sasl":
            _sasl_refusal_fails_the_login(self.client, self._login_failed)

    def start(self, timeout: float = 30.0, lock_open_tree: bool = False, create_root: bool | None = None) -> ZkSession:
        """Connect and make sure this process may use the cluster's tree.

        ``create_root``: create ``/eosink/<cluster>`` when it is missing (what ``eosink cluster init`` does);
        None: only without credentials (a worker with credentials refuses a missing root, see the module
        docstring). ``lock_open_tree``: take over a root left open by a run without credentials (see
        :func:`lock_open_tree_acls`) instead of refusing it.
        """
        try:
            self.client.start(timeout=timeout)
        except KazooTimeoutError as exc:
            if self._login_failed.is_set():  # the login failed before start() returned (the state is CLOSED by now)
                raise self._login_refused() from None
            how = f"over TLS trusting {self.ca_file}" if self.ca_file else "without TLS (a TLS-only server? set --zookeeper-ca-file)"
            raise CoordinatorUnavailableError(f"cannot connect to ZooKeeper at {self.hosts} {how}", component="zookeeper") from exc
        self._state = KazooState.CONNECTED
        try:
            self.created_root = self._ensure_root(lock_open_tree, self.credentials is None if create_root is None else create_root)
        except BaseException as exc:
            self.stop()
            if self._login_failed.is_set() and not isinstance(exc, CoordinatorAuthError):
                # a request sent as the login failed meets a closed connection, not the refusal itself
                raise self._login_refused() from None
            raise
        self._kazoo_log.quiet = False
        return self

    def _ensure_root(self, lock_open_tree: bool, create_root: bool) -> bool:
        """Check (and with ``create_root`` make) the cluster's root; True when this call created it."""
        try:
            if self.credentials is None:
                # Open to anyone, as before credentials existed; created without ensure_path, whose
                # exists("/eosink") a parent made by a worker with credentials refuses.
                if create_root:
                    _create(self.client, paths.ROOT, OPEN_ACL_UNSAFE)
                created = create_root and _created(self.client, self.root, OPEN_ACL_UNSAFE)
                self.client.get(self.root)  # a tree protected by ACLs refuses even this
                return bool(created)
            created = False
            if create_root:
                _create(self.client, paths.ROOT, TOP_ACL)
                self._warn_if_parent_open()
                created = _created(self.client, self.root, self.credentials.acl)
            self._check_root_acl(lock_open_tree)
            self.client.get(self.root)
            return created
        except AuthFailedError:
            raise self._login_refused() from None
        except SessionClosedRequireSaslError:
            raise CoordinatorAuthError(
                f"ZooKeeper at {self.hosts} requires authentication and closed the session before {self.root} "
                f"could be read: no credentials given (set {CREDENTIAL_SETTINGS})", component="zookeeper") from None
        except NoAuthError:
            if self.credentials is None:
                raise CoordinatorAuthError(
                    f"not authorized for {self.root} without credentials: its ACLs admit one principal (set {CREDENTIAL_SETTINGS})",
                    component="zookeeper") from None
            raise CoordinatorAuthError(
                f"not authorized for {self.root} as user {self.credentials.user}: a wrong password, or the tree belongs to "
                f"another principal (check {CREDENTIAL_SETTINGS})", component="zookeeper") from None

    def _login_refused(self) -> CoordinatorAuthError:
        user = self.credentials.user if self.credentials else "(none)"
        return CoordinatorAuthError(
            f"ZooKeeper at {self.hosts} refused the login of user {user} (SASL DIGEST-MD5): a wrong password, a user the "
            f"server does not know, or a server without SASL users (then --zookeeper-auth-scheme digest) (check "
            f"{CREDENTIAL_SETTINGS})", component="zookeeper")

    def _check_root_acl(self, lock_open_tree: bool) -> None:
        """The root must exist and admit this principal alone (or be open, and taken over on request)."""
        assert self.credentials is not None
        creds = self.credentials
        try:
            acls, _ = self.client.get_acls(self.root)
        except NoNodeError:
            raise ClusterRootMissingError(
                f"ZooKeeper at {self.hosts} has no {self.root}: run `{INIT_COMMAND} --cluster {self.root.rsplit('/', 1)[1]}` "
                f"once, as the cluster's principal (user {creds.user}), to create it with its ACLs; workers with "
                "credentials never create it", component="zookeeper") from None
        if any(a.id == ANYONE_ID_UNSAFE and a.perms for a in acls):
            if not lock_open_tree:
                raise OpenTreeError(
                    f"{self.root} is open to anyone (world:anyone), made by a worker without credentials, so anyone may "
                    f"have written it: stop that cluster's workers, check its connectors, then start one worker once "
                    f"with --zookeeper-lock-open-tree (EOSINK_ZOOKEEPER_LOCK_OPEN_TREE=true) to give the tree to user "
                    f"{creds.user}, or delete {self.root} as ZooKeeper's super user",
                    component="zookeeper")
            locked = lock_open_tree_acls(self.client, self.root, creds.acl)
            log.warning("zookeeper_tree_locked", root=self.root, user=creds.user, znodes=locked)
            return
        own = {a.id for a in creds.acl}
        others = sorted({f"{a.id.scheme}:{a.id.id}" for a in acls if a.id not in own})
        if others:
            raise ClusterRootForeignError(
                f"{self.root} also admits {', '.join(others)} besides {creds.scheme}:{creds.user}: it was not made by "
                f"`{INIT_COMMAND}` as this cluster's principal; check its connectors, delete it as ZooKeeper's super "
                f"user, then run `{INIT_COMMAND}`", component="zookeeper")

    def _warn_if_parent_open(self) -> None:
        """``/eosink`` made by a run without credentials lets anyone re-ACL it and so stop new clusters from being
        created (never touch an existing one: deleting or changing a cluster's root needs that cluster's ACLs).
        Worth a warning, not a refusal: only ZooKeeper's super user can change it."""
        try:
            acls, _ = self.client.get_acls(paths.ROOT)
        except NoAuthError:
            return  # TOP_ACL: not even readable
        if any(a.id == ANYONE_ID_UNSAFE and a.perms & ~Permissions.CREATE for a in acls):
            log.warning("zookeeper_parent_open", path=paths.ROOT,
                        fix=f"as ZooKeeper's super user: setAcl {paths.ROOT} world:anyone:c")

    def stop(self) -> None:
        self._stopping = True  # a LOST state from our own close is not news
        self._kazoo_log.quiet = True
        try:
            self.client.stop()
            self.client.close()
        except Exception:  # noqa: BLE001 - shutting down
            pass

    def _on_state(self, state: str) -> None:
        # Runs on kazoo's thread: keep it short, never block.
        if self._stopping:
            return
        with self._lock:
            back = state == KazooState.CONNECTED and self._state != KazooState.CONNECTED
            self._state = state
            if state == KazooState.SUSPENDED:
                self._suspended_at = time.monotonic()
            elif state == KazooState.CONNECTED:
                self._suspended_at = None
        if state != KazooState.CONNECTED and not self._kazoo_log.quiet:  # a refused start is reported as one error
            log.warning("zookeeper_state", state=state)
        if back:
            for callback in list(self._on_reconnect):
                callback()

    def on_reconnect(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on kazoo's thread: it must not block) whenever the connection comes back, so
        work that waits out a backoff because ZooKeeper was away can go on at once."""
        self._on_reconnect.append(callback)

    def can_decide(self) -> bool:
        return self._state == KazooState.CONNECTED and self.client.connected

    def session_probably_lost(self) -> bool:
        """True when the session is LOST, or suspended for longer than the session timeout."""
        with self._lock:
            if self._state == KazooState.LOST:
                return True
            return self._suspended_at is not None and time.monotonic() - self._suspended_at > self.session_timeout

    def require_connected(self, wait: float | None = None) -> None:
        deadline = time.monotonic() + (wait if wait is not None else self.request_timeout)
        while not self.can_decide():
            if time.monotonic() > deadline:
                raise CoordinatorUnavailableError(f"not connected to ZooKeeper ({self._state}) at {self.hosts}",
                                                  component="zookeeper")
            time.sleep(0.05)


#: The longest pause between two rounds of connection attempts over every listed server.
RECONNECT_MAX_DELAY_S = 1.0


def connection_retry() -> KazooRetry:
    """Reconnect forever, backing off to at most :data:`RECONNECT_MAX_DELAY_S` between rounds.

    kazoo's default doubles the pause without a useful bound (3600 s): after an outage of half a minute
    (an ensemble without a quorum) a client waited up to 25 s more before it tried again, long after the
    quorum was back, and its session expired meanwhile. A new leader gives every session a fresh timeout,
    so a client back within it keeps its session, its ephemeral znodes and its partitions.
    """
    return KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_jitter=0.4, max_delay=RECONNECT_MAX_DELAY_S)


def _create(client: KazooClient, path: str, acl: list[ACL]) -> None:
    """Create ``path`` with ``acl`` unless it exists. Not ``ensure_path``: its ``exists`` needs READ on
    the path, which ``/eosink`` gives nobody."""
    _created(client, path, acl)


def lock_open_tree_acls(client: KazooClient, root: str, acl: list[ACL]) -> int:
    """Give every znode under ``root`` (then ``root`` itself, last) the ACL ``acl``; returns how many.

    Leaves first and the root last, so a root no longer open means the whole tree was done: an
    interrupted run leaves the root open and is refused again, and running it again finishes it.
    Needs ADMIN on every znode, which a tree made without credentials gives anyone.
    """
    count = 0

    def walk(path: str) -> None:
        nonlocal count
        try:
            children = client.get_children(path)
        except NoNodeError:
            return  # an ephemeral znode gone meanwhile
        for child in children:
            walk(f"{path}/{child}")
        try:
            client.set_acls(path, acl)
            count += 1
        except NoNodeError:
            pass

    walk(root)
    return count


def kazoo_client(hosts: str, credentials: ZkCredentials | None = None, ca_file: str | None = None,
                 **kwargs: Any) -> KazooClient:
    """A KazooClient (not started) that authenticates as ``credentials`` and creates znodes only they may use;
    ``ca_file``: over TLS, verifying the server's certificate and host name against this CA."""
    auth = credentials.client_kwargs() if credentials else {}
    client = KazooClient(hosts=hosts, use_ssl=ca_file is not None, ca=ca_file, verify_certs=True,
                         check_hostname=ca_file is not None, **auth, **kwargs)
    if credentials is not None and credentials.scheme == "sasl":
        _sasl_refusal_fails_the_login(client)
    return client


def _sasl_refusal_fails_the_login(client: KazooClient, failed: threading.Event | None = None) -> None:
    """Make a SASL login the server refuses end the session as AUTH_FAILED, as kazoo does for other login failures.

    ZooKeeper answers a wrong DIGEST-MD5 password with the error SESSION_CLOSED_REQUIRE_SASL_AUTH;
    kazoo 2.11 raises it out of its connection thread, which dies with a traceback on stderr while the
    request waiting on the session gets ConnectionLoss. As AuthFailedError it is what kazoo handles:
    the session state becomes AUTH_FAILED, no reconnection is tried, waiting requests get AuthFailedError.
    (kazoo's development line catches it itself, after 2.11; this stays harmless there.) ``failed`` is set
    on every failed login, so a caller can tell one from a lost connection after the state moved on.
    """
    conn = client._connection
    login = conn._authenticate_with_sasl

    def authenticate(host: str, timeout: float) -> None:
        try:
            login(host, timeout)
        except AuthFailedError:
            if failed is not None:
                failed.set()
            raise
        except SessionClosedRequireSaslError as exc:
            if failed is not None:
                failed.set()
            raise AuthFailedError("the server refused the SASL login") from exc

    conn._authenticate_with_sasl = authenticate


def _created(client: KazooClient, path: str, acl: list[ACL]) -> bool:
    """Create ``path`` with ``acl`` unless it exists; True when this call created it."""
    try:
        client.create(path, acl=acl)
    except NodeExistsError:
        return False
    return True
