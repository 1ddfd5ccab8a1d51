"""ZooKeeper credentials on the command line: the flags, and what they resolve to.

The password is never a command-line value of its own (``ps`` shows every argument to anyone on
the host): it comes from ``EOSINK_ZOOKEEPER_PASSWORD`` or from the file ``--zookeeper-password-file``
names. Either may hold a ``${env:VAR}`` / ``${file:/path:key}`` reference, resolved by the same
config providers as connector configs, so a worker can name the stack's ``credentials.properties``
instead of copying a password. The resolved password goes to the log redactor before anything logs.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from eosink.connectors.api.errors import ConfigError
from eosink.worker.clients import typed
from eosink.worker.clients.typed import setting
from eosink.worker.engine.zk import SCHEMES, ZkCredentials

PASSWORD_ENV = "EOSINK_ZOOKEEPER_PASSWORD"


def _user(raw: str) -> str:
    if raw != raw.strip() or any(c.isspace() or c == ":" for c in raw):  # digest splits user:password at the first ':'
        raise ValueError(raw)
    return raw


#: Empty means "no credentials".
USER = typed.Kind(_user, "a user name without spaces or ':'")


def _scheme(raw: str) -> str:
    if raw.strip().lower() not in ("", *SCHEMES):
        raise ValueError(raw)
    return raw.strip().lower()


#: Empty means "the local stack's, else sasl".
SCHEME = typed.Kind(_scheme, "sasl or digest")


@dataclass(frozen=True)
class StackZooKeeper:
    """The local stack's ZooKeeper security, when that stack is secure (all empty otherwise)."""

    hosts: str = ""
    user: str = ""
    password_ref: str = ""  # a ${file:...} reference into credentials.properties, never the password
    ca_file: str = ""
    scheme: str = "sasl"


def stack_defaults() -> StackZooKeeper:
    """The local secure stack's ZooKeeper user, password reference and CA, for defaults.

    Lets ``eosink worker`` against ``eosink stack up --secure`` need no credential settings, as it
    needs no address; used only for the stack's own address, so they never go to another server.
    """
    try:
        from eosink.worker.stack import load_endpoints

        ep = load_endpoints()
        zk = (ep.raw or {}).get("zookeeper", {})
        if ep.security and zk.get("user") and zk.get("password_key"):
            return StackZooKeeper(ep.zookeeper_hosts, zk["user"], f"${{file:{ep.security['credentials_file']}:{zk['password_key']}}}",
                                  zk.get("ca_file", "") if zk.get("tls") else "", zk.get("auth_scheme", "sasl"))
    except Exception:  # noqa: BLE001 - no local stack, or an open one: the settings must say
        pass
    return StackZooKeeper()


def add_args(p: argparse.ArgumentParser, defaults: StackZooKeeper | None = None) -> None:
    """``--zookeeper-user``, ``--zookeeper-password-file`` (the password itself: ``EOSINK_ZOOKEEPER_PASSWORD``)
    and ``--zookeeper-ca-file``.

    ``defaults``: :func:`stack_defaults`, applied when ``--zookeeper`` is the local stack's address.
    """
    setting(p, "--zookeeper-user", kind=USER, env="EOSINK_ZOOKEEPER_USER", default="",
            help="ZooKeeper user: authenticate as it (see --zookeeper-auth-scheme), and create every znode of the cluster "
                 f"readable and writable by it alone; its password comes from {PASSWORD_ENV} or --zookeeper-password-file (either may be "
                 "${env:VAR} or ${file:/path:key})")
    setting(p, "--zookeeper-password-file", kind=typed.TEXT, env="EOSINK_ZOOKEEPER_PASSWORD_FILE", default="",
            help="file holding the ZooKeeper password (its first line), instead of " + PASSWORD_ENV)
    setting(p, "--zookeeper-auth-scheme", kind=SCHEME, env="EOSINK_ZOOKEEPER_AUTH_SCHEME", default="",
            metavar="sasl|digest",
            help="sasl (default): SASL DIGEST-MD5, the server checks the password at login and the ACLs name sasl:<user>; "
                 "digest: for a ZooKeeper without SASL, the password is checked by the ACLs (digest:<user>:<hash>) only")
    setting(p, "--zookeeper-ca-file", kind=typed.TEXT, env="EOSINK_ZOOKEEPER_CA_FILE", default="",
            help="connect to ZooKeeper over TLS, verifying its certificate (and host name) against this CA (PEM)")
    p.set_defaults(zookeeper_stack_defaults=defaults or StackZooKeeper())


def _stack(args: argparse.Namespace) -> StackZooKeeper:
    """The stack's defaults when ``--zookeeper`` is the stack's own address, else none."""
    d: StackZooKeeper = getattr(args, "zookeeper_stack_defaults", None) or StackZooKeeper()
    return d if d.hosts and getattr(args, "zookeeper", None) == d.hosts else StackZooKeeper()


def ca_file(args: argparse.Namespace) -> str | None:
    """The CA to verify ZooKeeper's TLS certificate against (None: plaintext); it must be readable."""
    path = args.zookeeper_ca_file or _stack(args).ca_file
    if not path:
        return None
    try:
        Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", key="--zookeeper-ca-file", source="zookeeper settings") from None
    return path


def credentials(args: argparse.Namespace) -> ZkCredentials | None:
    """The credentials the settings name, resolved; None when none are set. A half-given pair is an error."""
    from eosink.worker.control.config import resolve_providers
    from eosink.worker.logging import register_secret

    user = args.zookeeper_user or ""
    raw, source = _password(args)
    stack = _stack(args)
    scheme = getattr(args, "zookeeper_auth_scheme", "") or ""
    if not user and not raw and stack.user:
        user, raw, source = stack.user, stack.password_ref, "the local stack's credentials"
        scheme = scheme or stack.scheme
    if not user and not raw:
        return None
    if not user:
        raise ConfigError("a ZooKeeper password is set but no user: set --zookeeper-user (EOSINK_ZOOKEEPER_USER) too",
                          key="--zookeeper-user", source=source)
    if not raw:
        raise ConfigError(f"ZooKeeper user {user} has no password: set {PASSWORD_ENV} or --zookeeper-password-file",
                          key=PASSWORD_ENV, source="zookeeper settings")
    password = resolve_providers(raw, key=PASSWORD_ENV if source == "environment" else "--zookeeper-password-file",
                                 source=f"zookeeper settings ({source})").strip()
    if not password:
        raise ConfigError(f"the ZooKeeper password of user {user} is empty", key=PASSWORD_ENV, source=source)
    register_secret(password)
    register_secret(raw)
    return ZkCredentials(user, password, scheme or "sasl")


def _password(args: argparse.Namespace) -> tuple[str, str]:
    """The raw password (maybe a reference) and where it came from."""
    env = os.environ.get(PASSWORD_ENV, "")
    path = args.zookeeper_password_file or ""
    if env and path:
        raise ConfigError(f"both {PASSWORD_ENV} and --zookeeper-password-file are set: keep one", key=PASSWORD_ENV,
                          source="zookeeper settings")
    if path:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}", key="--zookeeper-password-file",
                              source="zookeeper settings") from None
        return (lines[0].strip() if lines else ""), f"file {path}"
    return env, "environment"


def stack_security() -> tuple[ZkCredentials | None, str | None]:
    """The local secure stack's credentials for cluster ``default`` (resolved) and its CA; (None, None) when open."""
    from eosink.worker.control.config import resolve_providers
    from eosink.worker.logging import register_secret

    stack = stack_defaults()
    if not stack.user:
        return None, None
    password = resolve_providers(stack.password_ref, key="zookeeper.password", source="the local stack's credentials")
    register_secret(password)
    return ZkCredentials(stack.user, password, stack.scheme), stack.ca_file or None
