"""S3 from MinIO, a real S3 server, built once from its Go module at a pinned version.

MinIO keeps its objects on disk under the stack's data directory, so a restart (``stack down``
and ``up``, or a SIGKILL in a crash test) keeps every bucket, object and unfinished multipart
upload. The S3 API listens on ``EOSINK_S3_PORT``, the web console on ``EOSINK_S3_CONSOLE_PORT``,
both on 127.0.0.1 only.

**Secure stack** (``layout.secure``, see :mod:`eosink.worker.stack.s3_secure`): HTTPS only, with
the stack's certificate; the root user's secret is the generated ``s3.root`` one, and the sink
user ``eosink-sink`` may use one bucket. The endpoint entry then holds no credentials at all:
``boto3.client("s3", **endpoint)`` gets the https URL, the region and ``verify=<the stack's CA>``,
and the caller adds the keys of the principal it acts as (``secure.Material``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eosink.worker.stack import gotools, proc, s3_secure
from eosink.worker.stack import secure as secure_material
from eosink.worker.stack.components.base import Component
from eosink.worker.stack.layout import HOST

PORT_ENV = "EOSINK_S3_PORT"
CONSOLE_PORT_ENV = "EOSINK_S3_CONSOLE_PORT"
MODULE = "github.com/minio/minio"
#: Pinned: the build is reproducible and cached per version (MinIO publishes its server as a Go module).
VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
#: MinIO wants a user of >= 3 and a password of >= 8 characters (the same pair as docker/compose.yaml).
CREDENTIALS = {"aws_access_key_id": "eosink", "aws_secret_access_key": "eosink-minio-secret", "region_name": "us-east-1"}


def server_argv(binary: Path, data_dir: Path, api_port: int, console_port: int, certs_dir: Path | None = None) -> list[str]:
    certs = ["--certs-dir", str(certs_dir)] if certs_dir is not None else []
    return [str(binary), "server", str(data_dir), "--address", f"{HOST}:{api_port}",
            "--console-address", f"{HOST}:{console_port}", *certs, "--quiet"]


def server_env(root: tuple[str, str] | None = None) -> dict[str, str]:
    """The server's environment; ``root``: (user, secret) of a secure stack instead of the open one's."""
    user, secret = root or (CREDENTIALS["aws_access_key_id"], CREDENTIALS["aws_secret_access_key"])
    return {**os.environ, "MINIO_ROOT_USER": user, "MINIO_ROOT_PASSWORD": secret, "MINIO_REGION": CREDENTIALS["region_name"],
            "MINIO_UPDATE": "off"}


def binary(report: Callable[[str], None] | None = None) -> Path:
    """The MinIO binary, built from its Go module on first use (see :mod:`eosink.worker.stack.gotools`)."""
    progress = gotools.ReportLines(report) if report is not None else None
    return gotools.go_binary(MODULE, VERSION, ["minio"], root="minio", component="s3", progress=progress)["minio"]


class S3(Component):
    name = "s3"
    ready_timeout_s = 60.0
    stop_timeout_s = 15.0

    def ports(self) -> dict[str, int]:
        return {PORT_ENV: self.layout.port(PORT_ENV), CONSOLE_PORT_ENV: self.layout.port(CONSOLE_PORT_ENV)}

    def endpoint(self) -> dict[str, Any]:
        if self.layout.secure:
            m = secure_material.material(self.layout)
            return {"endpoint_url": self.address(), "region_name": CREDENTIALS["region_name"], "verify": str(m.ca_cert)}
        return {"endpoint_url": self.address(), **CREDENTIALS}

    def address(self) -> str:
        scheme = "https" if self.layout.secure else "http"
        return f"{scheme}://{HOST}:{self.layout.port(PORT_ENV)}"

    def _root(self) -> tuple[str, str] | None:
        if not self.layout.secure:
            return None
        m = secure_material.material(self.layout)
        return m.user(s3_secure.ROOT_ROLE), m.password(s3_secure.ROOT_ROLE)

    def prepare(self, report: Callable[[str], None]) -> None:
        binary(report)

    def launch(self) -> int:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        certs = s3_secure.write_certs(secure_material.material(self.layout)) if self.layout.secure else None
        argv = server_argv(binary(), self.data_dir, self.layout.port(PORT_ENV), self.layout.port(CONSOLE_PORT_ENV), certs)
        return proc.spawn(argv, self.log_path, cwd=self.data_dir, env=server_env(self._root()))

    def probe(self) -> None:
        import boto3
        from botocore.config import Config

        config = Config(connect_timeout=1, read_timeout=3, retries={"max_attempts": 1})
        root = self._root()
        keys = {} if root is None else {"aws_access_key_id": root[0], "aws_secret_access_key": root[1]}
        boto3.client("s3", config=config, **self.endpoint(), **keys).list_buckets()

    def verify(self) -> None:
        """On a secure stack: the sink's bucket, user and one-bucket policy (idempotent, every start)."""
        if not self.layout.secure:
            return
        try:
            s3_secure.provision(secure_material.material(self.layout), self.address(), CREDENTIALS["region_name"])
        except Exception as e:  # noqa: BLE001 - whatever failed, the stack is not what it claims: report it
            raise self.fail(f"provisioning the sink's bucket, user and policy failed: {type(e).__name__}: {e}") from None
