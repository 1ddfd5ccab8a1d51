"""ZooKeeper 3.9 standalone, from the jars of ``jvm/zookeeper/pom.xml``."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from eosink.worker.stack import jvm, proc
from eosink.worker.stack.components.base import Component
from eosink.worker.stack.layout import HOST

PORT_ENV = "EOSINK_ZOOKEEPER_PORT"


class ZooKeeper(Component):
    name = "zookeeper"
    ready_timeout_s = 30.0

    @property
    def config_file(self) -> Path:
        return self.data_dir / "zoo.cfg"

    def ports(self) -> dict[str, int]:
        return {PORT_ENV: self.layout.port(PORT_ENV)}

    def endpoint(self) -> dict[str, Any]:
        return {"hosts": self.address()}

    def address(self) -> str:
        return f"{HOST}:{self.layout.port(PORT_ENV)}"


    def launch(self) -> int:
        classpath = jvm.classpath("zookeeper", self.name)
        java = jvm.java(self.name)
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(self._config())
        argv = [
            java, "-Xms64m", "-Xmx256m", "-XX:-UsePerfData", "-Djava.awt.headless=true",
            # slf4j-simple (see the pom) logs to stderr, which spawn() sends to zookeeper.log.
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
            "-cp", classpath, "org.apache.zookeeper.server.ZooKeeperServerMain", str(self.config_file),
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
            f"clientPortAddress={HOST}",
            f"clientPort={self.layout.port(PORT_ENV)}",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=ruok,srvr,mntr",
            "autopurge.purgeInterval=1",
            "autopurge.snapRetainCount=3",
            "",
        ])

    def probe(self) -> None:
        # `ruok` answers imok even when the server thread died at start-up (seen here: a missing
        # class while loading the database), so also ask `srvr`, which names the serving mode.
        for command, expect in ((b"ruok", b"imok"), (b"srvr", b"Mode: standalone")):
            with socket.create_connection((HOST, self.layout.port(PORT_ENV)), timeout=2) as s:
                s.sendall(command)
                s.shutdown(socket.SHUT_WR)
                answer = b""
                while chunk := s.recv(4096):
                    answer += chunk
            if expect not in answer:
                raise RuntimeError(f"`{command.decode()}` answered {answer[:120]!r}, expected {expect!r}: the server is not serving")
