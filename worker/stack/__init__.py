"""The real local stack: ZooKeeper, Kafka (KRaft), PostgreSQL and MinIO (S3) on 127.0.0.1.

Started by the project itself (``eosink stack up``), not by Docker: JVM servers run from jars
that Maven resolves once from poms in ``jvm/``, PostgreSQL from the Debian packages. Tests and
workers find it through :func:`load_endpoints`; crash tests restart single servers with
:func:`stop_component` / :func:`start_component`.
"""

from eosink.worker.stack.endpoints import Endpoints, load_endpoints
from eosink.worker.stack.errors import ComponentError, StackError, StackNotRunning
from eosink.worker.stack.manager import ComponentStatus, down, start_component, status, stop_component, up

__all__ = [
    "ComponentError",
    "ComponentStatus",
    "Endpoints",
    "StackError",
    "StackNotRunning",
    "down",
    "load_endpoints",
    "start_component",
    "status",
    "stop_component",
    "up",
]
