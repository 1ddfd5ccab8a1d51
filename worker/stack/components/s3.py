"""S3 from MinIO, a real S3 server, built once from its Go module at a pinned version.

MinIO keeps its objects on disk under the stack's data directory, so a restart (``stack down``
and ``up``, or a SIGKILL in a crash test) keeps every bucket, object and unfinished multipart
upload. The S3 API listens on ``EOSINK_S3_PORT``, the web console on ``EOSINK_S3_CONSOLE_PORT``,
both on 127.0.0.1 only.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eosink.worker.stack import gotools, proc
from eosink.worker.stack.components.base import Component
from eosink.worker.stack.layout import HOST

PORT_ENV = "EOSINK_S3_PORT"
CONSOLE_PORT_ENV = "EOSINK_S3_CONSOLE_PORT"
MODULE = "github.com/minio/minio"
#: Pinned: the build is reproducible and cached per version (MinIO publishes its server as a Go module).
VERSION = "v0.0.0-20260212201848-7aac2a2c5b7c"
#: MinIO wants a user of >= 3 and a password of >= 8 characters (the same pair as docker/compose.yaml).
CREDENTIALS = {"aws_access_key_id": "eosink", "aws_secret_access_key": "eosink-minio-secret", "region_name": "us-east-1"}


def server_argv(binary: Path, data_dir: Path, api_port: int, console_port: int) -> list[str]:
    return [str(binary), "server", str(data_dir), "--address", f"{HOST}:{api_port}",
            "--console-address", f"{HOST}:{console_port}", "--quiet"]


def server_env() -> dict[str, str]:
    return {**os.environ, "MINIO_ROOT_USER": CREDENTIALS["aws_access_key_id"],
            "MINIO_ROOT_PASSWORD": CREDENTIALS["aws_secret_access_key"], "MINIO_REGION": CREDENTIALS["region_name"],
            "MINIO_UPDATE": "off"}


def binary(report: Callable[[str], None] | None = None) -> Path:
    """The MinIO binary, built from its Go module on first use (see :mod:`eosink.worker.stack.gotools`)."""
    progress = gotools.ReportLines(report) if report is not None else None
    return gotools.go_binary(MODULE, VERSION, ["minio"], component="s3", progress=progress)["minio"]


class S3(Component):
    name = "s3"
    ready_timeout_s = 60.0
    stop_timeout_s = 15.0

    def ports(self) -> dict[str, int]:
        return {PORT_ENV: self.layout.port(PORT_ENV), CONSOLE_PORT_ENV: self.layout.port(CONSOLE_PORT_ENV)}

    def endpoint(self) -> dict[str, Any]:
        return {"endpoint_url": self.address(), **CREDENTIALS}

    def address(self) -> str:
        return f"http://{HOST}:{self.layout.port(PORT_ENV)}"

    def prepare(self, report: Callable[[str], None]) -> None:
        binary(report)

    def launch(self) -> int:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = server_argv(binary(), self.data_dir, self.layout.port(PORT_ENV), self.layout.port(CONSOLE_PORT_ENV))
        return proc.spawn(argv, self.log_path, cwd=self.data_dir, env=server_env())

    def probe(self) -> None:
        import boto3
        from botocore.config import Config

        config = Config(connect_timeout=1, read_timeout=3, retries={"max_attempts": 1})
        boto3.client("s3", config=config, **self.endpoint()).list_buckets()
