"""ZooKeeper 3.9 standalone, from the jars of ``jvm/zookeeper/pom.xml``.

A secure stack's ZooKeeper serves TLS only (1.2+, the stack's server certificate; no plaintext
port), authenticates every client session with SASL DIGEST-MD5 before its first request
(``enforce.auth.enabled`` with ``enforce.auth.schemes=sasl``: a session that sends a request first is
closed by the server, and a wrong password fails the login itself), and knows a super user
(``superUser``, a SASL user) that bypasses every ACL, for an operator's repair only: no eosink process
ever uses it. The users and their passwords are the JAAS file's ``Server`` section
(``DigestLoginModule``, ``user_<name>="<password>"``), written from ``credentials.properties`` at every
start. What a principal may do to a znode is the znode's ACL (``sasl:<user>``), set by
``eosink cluster init`` and the workers (:mod:`eosink.worker.engine.zk`). The four-letter-word probes
(``ruok``, ``srvr``) are not sessions and keep answering without credentials, over TLS.

SASL, not digest: digest authentication cannot fail (the server turns any ``user:password`` into an
id and only the ACLs refuse a wrong one), so a wrong password would show as "not authorized" on
the first znode; SASL refuses it at the session. Clients need kazoo's SASL support (``pure-sasl``).
"""

from __future__ import annotations

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
        """The address; on a secure stack also its CA (TLS only), the cluster ``default``'s SASL user and the
        key of its password in ``credentials.properties`` (never the password)."""
        if not self.layout.secure:
            return {"hosts": self.address()}
        from eosink.worker.stack import secure

        return {"hosts": self.address(), "tls": True, "ca_file": str(secure.material(self.layout).ca_cert),
                "auth_scheme": "sasl", "user": secure.USERS["zookeeper"], "password_key": "zookeeper.password"}

    @property
    def keystore(self) -> Path:
        """The server's key and certificate in one PEM file, as ZooKeeper's PEM key store reads them."""
        return self.data_dir / "keystore.pem"

    @property
    def jaas_file(self) -> Path:
        """A secure stack's SASL users and passwords (0600), as ZooKeeper's ``DigestLoginModule`` reads them."""
        return self.data_dir / "jaas.conf"

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
            _write_private(self.jaas_file, self._jaas())
        _write_private(self.config_file, self._config())  # 0600, as the JAAS file beside it
        argv = [
            java, "-Xms64m", "-Xmx256m", "-XX:-UsePerfData", "-Djava.awt.headless=true",
            *([f"-Djava.security.auth.login.config={self.jaas_file}"] if self.layout.secure else []),  # SASL users
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
        """A secure stack's lines: SASL authentication required, and the super user (a SASL user).

        ZooKeeper turns an unknown ``key=value`` of zoo.cfg into the system property ``zookeeper.<key>``,
        which is how these are read.
        """
        if not self.layout.secure:
            return []
        from eosink.worker.stack import secure

        m = secure.material(self.layout)
        return [
            "authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider",
            "enforce.auth.enabled=true",
            "enforce.auth.schemes=sasl",
            f"superUser={m.user('zookeeper.admin')}",
        ]

    def _jaas(self) -> str:
        """The JAAS ``Server`` section: every ZooKeeper principal of the stack (``secure.ZOOKEEPER_ROLES``) and its password."""
        from eosink.worker.stack import secure

        m = secure.material(self.layout)
        users = "\n".join(f'    user_{m.user(role)}="{_jaas_quote(m.password(role))}"' for role in secure.ZOOKEEPER_ROLES)
        return f"Server {{\n    org.apache.zookeeper.server.auth.DigestLoginModule required\n{users};\n}};\n"

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


def _jaas_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)  # an older file made 0644 keeps its mode through O_CREAT
