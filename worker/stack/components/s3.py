"""S3 from moto's server, run by the same Python that runs the stack (moto[server] is a test dep)."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from eosink.worker.stack import proc
from eosink.worker.stack.components.base import Component
from eosink.worker.stack.layout import HOST, port

PORT_ENV = "EOSINK_S3_PORT"
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


class S3(Component):
    name = "s3"
    ready_timeout_s = 30.0
    stop_timeout_s = 10.0

    def ports(self) -> dict[str, int]:
        return {PORT_ENV: port(PORT_ENV)}

    def endpoint(self) -> dict[str, Any]:
        return {"endpoint_url": self.address(), **CREDENTIALS}

    def address(self) -> str:
        return f"http://{HOST}:{port(PORT_ENV)}"


    def launch(self) -> int:
        missing = [m for m in ("moto.server", "flask") if importlib.util.find_spec(m.split(".")[0]) is None]
        if missing:
            raise self.fail(
                f"moto's server is not installed in {sys.executable} (missing {', '.join(missing)}); "
                "install the test extras: `pip install -e '.[test]'`"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port(PORT_ENV))]
        return proc.spawn(argv, self.log_path, cwd=self.data_dir)

    def probe(self) -> None:
        import boto3
        from botocore.config import Config

        config = Config(connect_timeout=1, read_timeout=3, retries={"max_attempts": 1})
        boto3.client("s3", config=config, **self.endpoint()).list_buckets()
