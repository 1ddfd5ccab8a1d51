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
from pathlib import Path

from eosink.connectors.api.errors import ConfigError
from eosink.worker.clients import typed
from eosink.worker.clients.typed import setting
from eosink.worker.engine.zk import ZkCredentials

PASSWORD_ENV = "EOSINK_ZOOKEEPER_PASSWORD"


def _user(raw: str) -> str:
    if raw != raw.strip() or any(c.isspace() or c == ":" for c in raw):  # digest splits user:password at the first ':'
        raise ValueError(raw)
    return raw


#: Empty means "no credentials".
USER = typed.Kind(_user, "a user name without spaces or ':'")


def stack_defaults() -> tuple[str, str, str]:
    """(hosts, user, password reference) of the local stack's ZooKeeper when that stack is secure, else empty.

    Lets ``eosink worker`` against ``eosink stack up --secure`` need no credential settings, as it
    needs no address; used only for the stack's own address, so they never go to another server.
    """
    try:
        from eosink.worker.stack import load_endpoints

        ep = load_endpoints()
        zk = (ep.raw or {}).get("zookeeper", {})
        if ep.security and zk.get("user") and zk.get("password_key"):
            return ep.zookeeper_hosts, zk["user"], f"${{file:{ep.security['credentials_file']}:{zk['password_key']}}}"
    except Exception:  # noqa: BLE001 - no local stack, or an open one: the settings must say
        pass
    return "", "", ""


def add_args(p: argparse.ArgumentParser, defaults: tuple[str, str, str] = ("", "", "")) -> None:
    """``--zookeeper-user`` and ``--zookeeper-password-file`` (the password itself: ``EOSINK_ZOOKEEPER_PASSWORD``).

    ``defaults``: :func:`stack_defaults`, applied when ``--zookeeper`` is the local stack's address.
    """
    hosts, user_default, password_default = defaults
    setting(p, "--zookeeper-user", kind=USER, env="EOSINK_ZOOKEEPER_USER", default="",
            help="ZooKeeper digest user: authenticate as it, and create every znode of the cluster readable and writable "
                 f"by it alone; its password comes from {PASSWORD_ENV} or --zookeeper-password-file (either may be "
                 "${env:VAR} or ${file:/path:key})")
    setting(p, "--zookeeper-password-file", kind=typed.TEXT, env="EOSINK_ZOOKEEPER_PASSWORD_FILE", default="",
            help="file holding the ZooKeeper password (its first line), instead of " + PASSWORD_ENV)
    p.set_defaults(zookeeper_stack_defaults=(hosts, user_default, password_default))


def credentials(args: argparse.Namespace) -> ZkCredentials | None:
    """The credentials the settings name, resolved; None when none are set. A half-given pair is an error."""
    from eosink.worker.control.config import resolve_providers
    from eosink.worker.logging import register_secret

    user = args.zookeeper_user or ""
    raw, source = _password(args)
    hosts, stack_user, stack_password = getattr(args, "zookeeper_stack_defaults", ("", "", ""))
    if not user and not raw and hosts and getattr(args, "zookeeper", None) == hosts:
        user, raw, source = stack_user, stack_password, "the local stack's credentials"
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
    return ZkCredentials(user, password)


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


def stack_credentials() -> ZkCredentials | None:
    """The local secure stack's credentials for cluster ``default``, resolved (None for an open stack)."""
    from eosink.worker.control.config import resolve_providers
    from eosink.worker.logging import register_secret

    _, user, reference = stack_defaults()
    if not user:
        return None
    password = resolve_providers(reference, key="zookeeper.password", source="the local stack's credentials")
    register_secret(password)
    return ZkCredentials(user, password)
