# syntax=docker/dockerfile:1
# eosink's Spark jobs (PySpark, local mode or any master), publishing outboxes exactly once.
#     docker build -f docker/spark-job.Dockerfile -t eosink-spark .
#     docker run --rm eosink-spark orders --bootstrap kafka:9092 --topic orders --n 10000 --run-id r1
# With a cluster, submit the same code instead: see "Spark jobs" in docs/control-plane.md.

FROM python:3.11-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY worker ./worker
COPY connectors ./connectors
COPY spark_jobs ./spark_jobs
RUN python -m venv /opt/eosink \
 && /opt/eosink/bin/pip install --no-cache-dir --upgrade pip \
 && /opt/eosink/bin/pip install --no-cache-dir -c constraints.txt .
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/eosink --create-home eosink
ENV PATH=/opt/eosink/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYSPARK_PYTHON=/opt/eosink/bin/python \
    EOSINK_HOME=/var/lib/eosink
USER eosink
WORKDIR /var/lib/eosink
ENTRYPOINT ["eosink", "spark", "run"]
CMD ["orders", "--help"]
