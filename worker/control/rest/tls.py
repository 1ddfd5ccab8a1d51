"""TLS for the REST API: the worker's server context and the CLI's client context.

Both are built once, at start, so a wrong file is one line naming the setting and the file before
anything listens or connects - never a handshake failure an hour later. The server accepts TLS 1.2
and newer only; the client always verifies the worker's certificate (against ``--rest-ca`` when
given, else the system's trust store): a REST API carrying credentials is never spoken to blindly.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from eosink.connectors.api.errors import ConfigError

CERT_SETTING = "--rest-tls-cert / EOSINK_REST_TLS_CERT"
KEY_SETTING = "--rest-tls-key / EOSINK_REST_TLS_KEY"
CA_SETTING = "--rest-ca / EOSINK_REST_CA"


def _readable(path: str, setting: str) -> Path:
    p = Path(path)
    try:
        with p.open("rb") as f:
            f.read(1)
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}", key=setting) from None
    return p


def _is_certificate(path: Path) -> bool:
    """Whether ``path`` holds a PEM certificate OpenSSL can load (tells a bad certificate from a bad key)."""
    try:
        ssl.create_default_context().load_verify_locations(cafile=str(path))
    except (ssl.SSLError, OSError):
        return False
    return True


def server_context(cert: str, key: str) -> ssl.SSLContext:
    """The worker's TLS context: ``cert`` (PEM, the chain may follow the leaf) with its private ``key``."""
    if not cert or not key:
        missing = KEY_SETTING if cert else CERT_SETTING
        raise ConfigError("is required with the other: the REST API serves TLS with a certificate and its key", key=missing)
    cert_path, key_path = _readable(cert, CERT_SETTING), _readable(key, KEY_SETTING)
    if not _is_certificate(cert_path):
        raise ConfigError(f"{cert_path} is not a PEM certificate", key=CERT_SETTING)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert_path), str(key_path))
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(f"{key_path} is not the private key of the certificate {cert_path}", key=KEY_SETTING) from None
        raise ConfigError(f"{key_path} is not a PEM private key (an encrypted key is not supported)", key=KEY_SETTING) from None
    return ctx


def ca_file(ca: str, setting: str) -> Path:
    """``ca`` if it is a readable PEM CA certificate; else a ConfigError naming ``setting`` and the file."""
    path = _readable(ca, setting)
    if not _is_certificate(path):
        raise ConfigError(f"{path} is not a PEM CA certificate", key=setting)
    return path


def client_context(ca: str | None) -> ssl.SSLContext:
    """The CLI's context: verification on, hostname checked; ``ca`` (PEM) is the authority to trust, when given."""
    if ca:
        return ssl.create_default_context(cafile=str(ca_file(ca, CA_SETTING)))
    return ssl.create_default_context()
