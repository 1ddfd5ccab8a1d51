"""What a locked-down stack is made of: its certificate authority, server certificate and passwords.

``eosink stack up --secure`` runs the same servers as the open stack, each locked down:

- Kafka: SASL/SCRAM-SHA-512 over TLS, an ACL authorizer that denies whatever no ACL allows;
- ZooKeeper: SASL (DIGEST-MD5) authentication required, ACLs on ``/eosink`` (see :mod:`eosink.worker.engine.zk`);
- PostgreSQL: scram-sha-256 over TLS only, the sink as a role that owns its own schema and nothing else;
- MinIO: TLS, the sink as a user whose policy allows one bucket;
- the Schema Registry: TLS with HTTP basic authentication, its storage a PostgreSQL role of its own
  (see :mod:`eosink.worker.stack.registry_secure`);
- the worker's REST API: TLS with HTTP basic authentication.

This module makes, once per home, the material those servers and their clients share, under
``<home>/stack/secrets`` (mode 0700, files 0600):

- ``ca.pem`` / ``ca.key``: a certificate authority made for this stack alone, the one certificate
  every client trusts (``ssl.ca.location``, ``sslrootcert``, boto3's ``verify``);
- ``server.pem`` / ``server.key``: one server certificate for ``127.0.0.1`` and ``localhost``, signed
  by that CA, served by every component;
- ``credentials.properties``: one generated password per principal, in the ``key=value`` form the
  ``${file:<path>:<key>}`` config provider reads, so a connector config names a secret instead of
  holding it (``connection.password=${file:.../credentials.properties:postgres.sink.password}``).

Nothing here is ever printed: :func:`register_secrets` hands every password to the log redactor.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from eosink.worker.stack.errors import StackError
from eosink.worker.stack.layout import StackLayout

#: Principals of the secure stack, by role. Passwords live in ``credentials.properties`` under
#: ``<key>.password`` (S3: ``<key>.secret_key``); user names are fixed so ACLs and docs can name them.
USERS: dict[str, str] = {
    "kafka.admin": "admin",                 # Kafka super user: the stack's own provisioning, inter-broker
    "kafka.worker": "eosink-worker",        # the sink workers: read outboxes, own consumer groups
    "kafka.publisher": "eosink-publisher",  # the Spark outbox publisher: transactional writes
    "zookeeper": "eosink",                  # the workers of cluster "default": owner of /eosink/default
    "zookeeper.other": "eosink-other",      # the workers of a second cluster beside "default": its own tree
    "zookeeper.admin": "super",             # ZooKeeper's super user (superUser): repair only, never a worker
    "postgres.admin": "eosink",             # the cluster's superuser (creates roles and databases)
    "postgres.sink": "eosink_sink",         # what sinks connect as: owns schema eosink_sink, nothing else
    "postgres.registry": "eosink_registry", # the Schema Registry's storage: owns schema eosink_registry, nothing else
    "s3.root": "eosink",                    # MinIO's root user (creates buckets, users and policies)
    "s3.sink": "eosink-sink",               # what sinks connect as: one bucket only
    "rest": "eosink",                       # the worker REST API's basic-auth user
    "registry": "eosink-registry",          # the Schema Registry's basic-auth user (workers and publishers)
}

#: The roles ZooKeeper's JAAS file knows: no other user can open a session.
ZOOKEEPER_ROLES = ("zookeeper", "zookeeper.other", "zookeeper.admin")

#: The bucket the S3 sink user may use, and nothing else.
SINK_BUCKET = "eosink-secure"
CREDENTIALS_FILE = "credentials.properties"
CERT_DAYS = 825  # what browsers and most TLS stacks still accept for a leaf certificate


@dataclass(frozen=True)
class Material:
    """Paths of one secure stack's shared material; every file exists once :func:`ensure` returned."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def server_cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.directory / "server.key"

    @property
    def credentials_file(self) -> Path:
        return self.directory / CREDENTIALS_FILE

    def credentials(self) -> dict[str, str]:
        """Every ``key=value`` of ``credentials.properties``."""
        return read_properties(self.credentials_file)

    def user(self, role: str) -> str:
        return USERS[role]

    def password(self, role: str) -> str:
        key = secret_key(role)
        try:
            return self.credentials()[key]
        except KeyError:
            raise StackError(f"{self.credentials_file} has no {key}; remove {self.directory} and run "
                             "`eosink stack up --secure` again to regenerate the stack's secrets") from None

    def reference(self, role: str) -> str:
        """``${file:...}`` reference to ``role``'s password, for connector configs and worker settings."""
        return f"${{file:{self.credentials_file}:{secret_key(role)}}}"


def secret_key(role: str) -> str:
    """The key of ``role``'s secret in ``credentials.properties``: S3 calls it a secret key, the rest a password."""
    return f"{role}.secret_key" if role.startswith("s3.") else f"{role}.password"


def endpoint(layout: StackLayout) -> dict[str, str]:
    """endpoints.json's ``security`` entry: where the CA and the passwords are (never the passwords)."""
    m = material(layout)
    return {"ca_file": str(m.ca_cert), "credentials_file": str(m.credentials_file), "sink_bucket": SINK_BUCKET}


def material(layout: StackLayout) -> Material:
    return Material(layout.secrets_dir)


def ensure(layout: StackLayout) -> Material:
    """Make the CA, the server certificate and the passwords once; later calls keep them.

    Kept across restarts on purpose: Kafka's SCRAM credentials are formatted into its log dir and
    PostgreSQL's role passwords into its catalog, so new passwords would lock the stack out.
    """
    m = material(layout)
    m.directory.mkdir(parents=True, exist_ok=True)
    os.chmod(m.directory, 0o700)
    if not (m.ca_cert.exists() and m.ca_key.exists()):
        _write_ca(m)
    if not (m.server_cert.exists() and m.server_key.exists()):
        _write_server_cert(m)
    _ensure_credentials(m)
    register_secrets(m)
    return m


def register_secrets(m: Material) -> None:
    """Hand every generated password to the log redactor, so none is ever logged in clear."""
    from eosink.worker.logging import register_secret

    for key, value in m.credentials().items():
        if key.endswith((".password", ".secret_key")):
            register_secret(value)


def read_properties(path: Path) -> dict[str, str]:
    """A Java-style properties file of ``key=value`` lines (``#`` comments), as the file provider reads it."""
    out: dict[str, str] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise StackError(f"{path} does not exist: run `eosink stack up --secure` to create the stack's secrets") from None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, _, value = line.partition("=")
        out[key.strip()] = value.strip()
    return out


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` readable by its owner only (keys, passwords), atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _ensure_credentials(m: Material) -> None:
    existing = read_properties(m.credentials_file) if m.credentials_file.exists() else {}
    lines = ["# Generated by `eosink stack up --secure`: one password per principal of this stack.",
             "# Read by ${file:<this file>:<key>} references; never copy these values into a config."]
    changed = not m.credentials_file.exists()
    for role, user in USERS.items():
        key = secret_key(role)
        user_key = f"{role}.access_key" if role.startswith("s3.") else f"{role}.username"
        value = existing.get(key)
        if not value:
            value = secrets.token_urlsafe(24)
            changed = True
        lines += [f"{user_key}={user}", f"{key}={value}"]
    if changed:
        write_private(m.credentials_file, ("\n".join(lines) + "\n").encode())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_ca(m: Material) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "eosink"),
                      x509.NameAttribute(NameOID.COMMON_NAME, f"eosink stack CA {secrets.token_hex(4)}")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    write_private(m.ca_key, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    m.ca_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    # A new CA invalidates any server certificate signed by the old one.
    m.server_cert.unlink(missing_ok=True)


def _write_server_cert(m: Material) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ca_key = serialization.load_pem_private_key(m.ca_key.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(m.ca_cert.read_bytes())
    if not isinstance(ca_key, rsa.RSAPrivateKey):
        raise StackError(f"{m.ca_key} is not the RSA key this stack made; remove {m.directory} and run `eosink stack up --secure`")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "eosink"),
                                 x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=CERT_DAYS))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    write_private(m.server_key, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
    m.server_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
