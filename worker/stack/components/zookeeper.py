"""ZooKeeper 3.9 standalone, from the jars of ``jvm/zookeeper/pom.xml``.

A secure stack's ZooKeeper serves TLS only (1.2+, the stack's server certificate; no plaintext
port: digest credentials would cross it in clear), requires every client session to authenticate
with the ``digest`` scheme before its first request (``enforce.auth.enabled``: a session that
sends a request first is closed by the server), and knows a ``super`` user (``superDigest``) that
bypasses every ACL, for an operator's repair only: no eosink process ever uses it. What a principal may do to a znode is the
znode's ACL, set by the workers (:mod:`eosink.worker.engine.zk`). The four-letter-word probes
(``ruok``, ``srvr``) are not sessions and keep answering without credentials, over TLS.

digest, not SASL: digest authentication cannot "fail" (the server turns ``user:password`` into an
id and the ACLs decide what that id may do), so enforcing it means "no anonymous session", and
the ACLs mean "nobody but the cluster's principal". SASL DIGEST-MD5 would add a password check at
connect time but needs a JAAS file on both sides; kazoo's SASL needs the ``pure-sasl`` package.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import ssl
from pathlib import Path
from typing import Any, ClassVar

from eosink.worker.stack import jvm, proc
from eosink.worker.stack.components.base import Component
from eosink.worker.stack.layout import HOST

PORT_ENV = "EOSINK_ZOOKEEPER_PORT"


class ZooKeeper(Component):
    name = "zookeeper"
    ready_timeout_s = 30.0
    #: The server's main class (an ensemble node runs ``QuorumPeerMain``, see :mod:`zookeeper_ensemble`).
    main_class: ClassVar[str] = "org.apache.zookeeper.server.ZooKeeperServerMain"

    @property
    def config_file(self) -> Path:
        return self.data_dir / "zoo.cfg"

    def ports(self) -> dict[str, int]:
        return {PORT_ENV: self.layout.port(PORT_ENV)}

    def endpoint(self) -> dict[str, Any]:
        """The address; on a secure stack also its CA (TLS only), the cluster ``default``'s digest user and the
        key of its password in ``credentials.properties`` (never the password)."""
        if not self.layout.secure:
            return {"hosts": self.address()}
        from eosink.worker.stack import secure

        return {"hosts": self.address(), "tls": True, "ca_file": str(secure.material(self.layout).ca_cert),
                "auth_scheme": "digest", "user": secure.USERS["zookeeper"], "password_key": "zookeeper.password"}

    @property
    def keystore(self) -> Path:
        """The server's key and certificate in one PEM file, as ZooKeeper's PEM key store reads them."""
        return self.data_dir / "keystore.pem"

    def address(self) -> str:
        return f"{HOST}:{self.layout.port(PORT_ENV)}"

    def launch(self) -> int:
        classpath = jvm.classpath("zookeeper", self.name)
        java = jvm.java(self.name)
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        if self.layout.secure:
            from eosink.worker.stack import secure

            m = secure.material(self.layout)
            _write_private(self.keystore, m.server_key.read_text() + m.server_cert.read_text())
        _write_private(self.config_file, self._config())  # 0600: a secure stack's holds the super user's digest
        argv = [
            java, "-Xms64m", "-Xmx256m", "-XX:-UsePerfData", "-Djava.awt.headless=true",
            # slf4j-simple (see the pom) logs to stderr, which spawn() sends to zookeeper.log.
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
            "-cp", classpath, self.main_class, str(self.config_file),
        ]
        return proc.spawn(argv, self.log_path, cwd=self.data_dir)

    def _config(self) -> str:
        # tickTime=500: sessions are expired in buckets of one tick, so a dead worker's partitions
        # move within ~0.5 s of its session timeout (with 2000 it was up to 2 s later);
        # minSessionTimeout=1000 lets tests use short sessions. The 4lw whitelist enables the
        # `ruok`/`srvr` readiness probes; the admin server would take port 8080.
        return "\n".join([
            "tickTime=500",
            "minSessionTimeout=1000",
            "maxSessionTimeout=60000",
            f"dataDir={self.data_dir / 'data'}",
            *self._listener(),
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,mntr",
            "autopurge.purgeInterval=1",
            "autopurge.snapRetainCount=3",
            *self._secure_config(),
            "",
        ])

    def _listener(self) -> list[str]:
        """Plaintext on the open stack; TLS only on a secure one (Netty serves TLS, including the 4lw probes)."""
        port = self.layout.port(PORT_ENV)
        if not self.layout.secure:
            return [f"clientPortAddress={HOST}", f"clientPort={port}"]
        from eosink.worker.stack import secure

        ca = secure.material(self.layout).ca_cert
        return [
            f"secureClientPortAddress={HOST}",
            f"secureClientPort={port}",
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
            f"ssl.keyStore.location={self.keystore}",
            "ssl.keyStore.type=PEM",
            f"ssl.trustStore.location={ca}",
            "ssl.trustStore.type=PEM",
            "ssl.clientAuth=none",  # clients prove who they are with digest credentials, not certificates
            "ssl.enabledProtocols=TLSv1.3,TLSv1.2",
        ]

    def _secure_config(self) -> list[str]:
        """A secure stack's lines: digest authentication required, and the super user's digest.

        ZooKeeper turns an unknown ``key=value`` of zoo.cfg into the system property ``zookeeper.<key>``,
        which is how both are read; in zoo.cfg (0600) the digest stays out of ``ps``.
        """
        if not self.layout.secure:
            return []
        from eosink.worker.stack import secure

        m = secure.material(self.layout)
        user = m.user("zookeeper.admin")
        return [
            "enforce.auth.enabled=true",
            "enforce.auth.schemes=digest",
            f"DigestAuthenticationProvider.superDigest={digest_id(user, m.password('zookeeper.admin'))}",
        ]

    def probe(self) -> None:
        # `ruok` answers imok even when the server thread died at start-up (seen here: a missing
        # class while loading the database), so also ask `srvr`, which names the serving mode.
        for command, expect in ((b"ruok", b"imok"), (b"srvr", b"Mode: standalone")):
            answer = self._ask(command)
            if expect not in answer:
                raise RuntimeError(f"`{command.decode()}` answered {answer[:120]!r}, expected {expect!r}: the server is not serving")

    def _ask(self, command: bytes) -> bytes:
        """A four-letter word and its answer; over TLS, verifying the server against the stack's CA, when secure."""
        with socket.create_connection((HOST, self.layout.port(PORT_ENV)), timeout=2) as raw:
            s: socket.socket = raw
            if self.layout.secure:
                from eosink.worker.stack import secure

                ctx = ssl.create_default_context(cafile=str(secure.material(self.layout).ca_cert))
                s = ctx.wrap_socket(raw, server_hostname=HOST)
            with s:
                s.sendall(command)
                if not self.layout.secure:
                    s.shutdown(socket.SHUT_WR)  # TLS has no half-close: the server closes after answering
                answer = b""
                while chunk := s.recv(4096):
                    answer += chunk
        return answer


def digest_id(user: str, password: str) -> str:
    """ZooKeeper's digest id of ``user:password`` (``user:base64(sha1(user:password))``), as its ACLs and
    ``superDigest`` name a principal; the same as kazoo's ``make_digest_acl_credential``."""
    digest = base64.b64encode(hashlib.sha1(f"{user}:{password}".encode()).digest()).decode()
    return f"{user}:{digest}"


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)  # an older file made 0644 keeps its mode through O_CREAT
