# syntax=docker/dockerfile:1
# eosink's Spark jobs (PySpark, local mode or any master), publishing outboxes exactly once.
#     docker build -f docker/spark-job.Dockerfile -t eosink-spark:0.1.0 .
#     docker run --rm eosink-spark:0.1.0 orders --bootstrap kafka:9092 --topic orders --n 10000 --run-id r1
# or `make images` / `eosink images build spark` (podman, Debian base, offline wheelhouse).
# With a cluster, submit the same code instead: see "Spark jobs" in docs/operations/containers.md.

# bookworm pinned: Debian 13 (what python:3.11-slim follows now) has no openjdk-17.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py constraints.txt README.md LICENSE ./
# Dependencies first, from the project metadata alone, so this large layer (PySpark) is reused until
# constraints.txt or pyproject.toml change. Wheels built on the host (eosink images build) are
# bind-mounted, never a layer; an empty docker/wheelhouse/spark (as checked in) means: from PyPI.
RUN --mount=type=bind,source=docker/wheelhouse/spark,target=/wheels \
    python3 -m venv /opt/eosink \
 && if ls /wheels/*.whl >/dev/null 2>&1; then set -- --no-index --find-links /wheels; \
    else /opt/eosink/bin/pip install --no-cache-dir --upgrade pip; fi \
 && /opt/eosink/bin/pip install --no-cache-dir "$@" -c constraints.txt ".[spark]"
COPY worker ./worker
COPY connectors ./connectors
COPY spark_jobs ./spark_jobs
RUN --mount=type=bind,source=docker/wheelhouse/spark,target=/wheels \
    if ls /wheels/*.whl >/dev/null 2>&1; then set -- --no-index --find-links /wheels; fi \
 && /opt/eosink/bin/pip install --no-cache-dir --no-deps --force-reinstall "$@" . \
 && rm -rf /src/build /src/*.egg-info
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/eosink --create-home eosink
ENV PATH=/opt/eosink/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYSPARK_PYTHON=/opt/eosink/bin/python \
    SPARK_LOCAL_IP=127.0.0.1 \
    EOSINK_HOME=/var/lib/eosink
USER eosink
WORKDIR /var/lib/eosink
ENTRYPOINT ["eosink", "spark", "run"]
CMD ["orders", "--help"]
