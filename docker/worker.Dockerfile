# syntax=docker/dockerfile:1
# The eosink worker. Build from the repository root:
#     docker build -f docker/worker.Dockerfile -t eosink-worker:0.1.0 .
# or `make images` / `eosink images build worker`, which builds with podman when no Docker engine
# answers, on a Debian base made by mmdebstrap (BASE_IMAGE) and from an offline wheelhouse.
# Configure with EOSINK_* variables (see `eosink worker --help` and docs/operations/cluster.md).

# bookworm pinned: the public base and the Debian base built here carry the same Python 3.11.
ARG BASE_IMAGE=python:3.11-slim-bookworm

# One stage: the base has no compiler, and pip keeps no cache (--no-cache-dir).
FROM ${BASE_IMAGE}
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/eosink --create-home eosink
WORKDIR /src
COPY pyproject.toml setup.py constraints.txt README.md LICENSE ./
# Dependencies first, from the project metadata alone (an eosink without its packages), so this
# large layer is reused until constraints.txt or pyproject.toml change. A worker runs no Spark: the
# `worker` extra is every sink's dependencies, pinned by constraints.txt, so PySpark stays out.
# Wheels built on the host (eosink images build) are bind-mounted, never a layer; an empty
# docker/wheelhouse/worker (as checked in) means: install from PyPI.
RUN --mount=type=bind,source=docker/wheelhouse/worker,target=/wheels \
    python3 -m venv /opt/eosink \
 && if ls /wheels/*.whl >/dev/null 2>&1; then set -- --no-index --find-links /wheels; \
    else /opt/eosink/bin/pip install --no-cache-dir --upgrade pip; fi \
 && /opt/eosink/bin/pip install --no-cache-dir "$@" -c constraints.txt ".[worker]"
COPY worker ./worker
COPY connectors ./connectors
COPY spark_jobs ./spark_jobs
# Then eosink itself: a small layer, rebuilt on every change of the code.
RUN --mount=type=bind,source=docker/wheelhouse/worker,target=/wheels \
    if ls /wheels/*.whl >/dev/null 2>&1; then set -- --no-index --find-links /wheels; fi \
 && /opt/eosink/bin/pip install --no-cache-dir --no-deps --force-reinstall "$@" . \
 && rm -rf /src/build /src/*.egg-info
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
# With EOSINK_REST_TLS_CERT set the port speaks https only; this probe of the container's own loopback
# carries no credentials and the certificate names the service's host, so it does not verify.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, ssl, urllib.request; tls = bool(os.environ.get('EOSINK_REST_TLS_CERT')); ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE; urllib.request.urlopen('%s://127.0.0.1:%s/health' % ('https' if tls else 'http', os.environ.get('EOSINK_REST_PORT', '8083')), timeout=2, context=ctx if tls else None)"]
ENTRYPOINT ["eosink", "worker"]
