# syntax=docker/dockerfile:1
# The eosink worker. Build from the repository root:
#     docker build -f docker/worker.Dockerfile -t eosink-worker .
# Configure with EOSINK_* variables (see `eosink worker --help` and docs/control-plane.md).

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY worker ./worker
COPY connectors ./connectors
COPY spark_jobs ./spark_jobs
# A worker runs no Spark: install the worker's dependencies (pinned by constraints.txt), then eosink
# itself without dependencies, so PySpark and its jars stay out of the image. tests/test_docker.py
# checks this list against pyproject.toml's dependencies.
RUN python -m venv /opt/eosink \
 && /opt/eosink/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/eosink/bin/pip install --no-cache-dir -c constraints.txt \
        "confluent-kafka>=2.16.1" \
        "kazoo>=2.11.0" \
        "psycopg[binary]>=3.3.9" \
        "boto3>=1.43" \
        "pyiceberg[pyarrow,sql-postgres]>=0.12.0,<0.13" \
        "pyarrow>=26.0.1" \
        "structlog>=26.1.0" \
        "prometheus-client>=0.26.0" \
 && /opt/eosink/bin/pip install --no-cache-dir --no-deps .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/eosink --create-home eosink
COPY --from=build /opt/eosink /opt/eosink
ENV PATH=/opt/eosink/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    EOSINK_HOME=/var/lib/eosink \
    EOSINK_LOG_FORMAT=json \
    EOSINK_REST_HOST=0.0.0.0 \
    EOSINK_REST_PORT=8083
USER eosink
WORKDIR /var/lib/eosink
EXPOSE 8083
# SIGTERM: the worker finishes the cycle in flight, releases its partitions at once and exits 0.
STOPSIGNAL SIGTERM
# Liveness on the REST port (open even when REST authentication is on); no curl in a slim image.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('EOSINK_REST_PORT', '8083'), timeout=2)"]
ENTRYPOINT ["eosink", "worker"]
