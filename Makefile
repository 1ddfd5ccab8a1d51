# eosink: the two set-up commands are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
PY_SYS ?= python3
VENV := .venv
PY := $(VENV)/bin/python
EOSINK := $(VENV)/bin/eosink
# setuptools' one notice for every editable install of a package_dir layout ("be careful with folders
# ... with the same name as your package"): there is no such folder here, so it is filtered, and
# nothing else is; any other warning of the install still shows.
PIP_QUIET := PYTHONWARNINGS="ignore:Editable installation"
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt setup.py spark_jobs/native/produce.c worker/native/_avro_rows.c worker/native/_records.c connectors/postgres/_copy_rows.c connectors/common/_batches.c connectors/iceberg/_json_columns.c connectors/common/_json_scan.h | sha1sum | cut -c1-12)

.PHONY: venv stack secure-stack demo stream-demo secure-demo test docs observe down clean bench soak images container-demo helm-template $(BENCHES)

$(STAMP):
	@test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PIP_QUIET) $(PY) -m pip install -q -c constraints.txt -e '.[test]'
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

venv: $(STAMP)

stack: venv
	$(EOSINK) stack up

# The same servers locked down (TLS, SASL/SCRAM, ACLs, least-privilege roles), 100 ports higher,
# in a home of its own beside the open stack's.
SECURE_HOME := $(CURDIR)/.eosink-secure
secure-stack: venv
	EOSINK_HOME=$(SECURE_HOME) $(EOSINK) stack up --secure

demo: stack
	$(EOSINK) demo

# The streaming example end to end: balance_alerts --stream, its driver SIGKILLed once, PostgreSQL + HTTP counted.
stream-demo: stack
	$(EOSINK) demo --stream

# The demo on the secure stack: every step as its least-privilege principal, over TLS.
secure-demo: secure-stack
	EOSINK_HOME=$(SECURE_HOME) $(EOSINK) demo

# Lint, types and the documentation site first (seconds; --strict: a broken link, page or anchor
# fails), then the suite against the real stack.
test: stack secure-stack
	$(PY) -m ruff check .
	$(PY) -m mypy
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet
	$(PY) -m pytest $(PYTEST_ARGS)

# The documentation site (docs/, mkdocs.yml) at http://127.0.0.1:8000, rebuilt as pages change.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve --dev-addr 127.0.0.1:8000

# Three workers watched by a real Prometheus with docker/observability/alerts.yml; a drill fires
# EosinkTaskFailed and EosinkWorkerDown; prints the URL and the firing alerts (OBSERVE_ARGS=--once to exit).
observe: stack
	$(PY) bench/observe.py $(OBSERVE_ARGS)

# Container images (eosink-worker, eosink-spark): podman when no Docker engine answers, on a Debian
# base made by mmdebstrap, from a wheelhouse built here (see docs/operations/containers.md).
images: venv
	nice $(EOSINK) images build $(IMAGES)

# Three worker containers deliver the demo's fan-out connector through SIGKILL and SIGTERM.
container-demo: stack images
	$(PY) -m eosink.worker.stack.container_demo

# The Helm chart's manifests (deploy/helm/eosink), rendered by the pinned helm (built from its Go module on
# first use); HELM_ARGS gives values, e.g. HELM_ARGS="-f my-values.yaml" (see docs/operations/kubernetes.md).
HELM_ARGS ?= --set zookeeper=zookeeper:2181 --set kafka.bootstrapServers=kafka:9092
helm-template: venv
	@$(PY) -m eosink.worker.stack.helm template eosink deploy/helm/eosink $(HELM_ARGS)

# Benchmarks (ratios against a baseline measured in the same script): `make bench-worker`, ...
BENCHES := bench-e2e bench-audit bench-worker bench-cluster bench-connectors bench-postgres bench-s3 bench-http bench-iceberg bench-spark bench-spark-avro bench-spark-streaming bench-latency bench-stream-latency bench-peers
bench: $(BENCHES)
# bench-X runs bench/bench_X.py (dashes as underscores), bench/bench_X_sink.py or bench/bench_X_publisher.py, whichever exists.
$(BENCHES): bench-%: stack
	$(PY) $(firstword $(wildcard bench/bench_$(subst -,_,$*).py bench/bench_$*_sink.py bench/bench_$*_publisher.py)) $(BENCH_ARGS)

# 20 minutes: a producer, three workers, a random worker kill -9'd every ~30 s; prints each
# worker's RSS and open fds as it goes, then counts the sink (SOAK_ARGS="--minutes 5" to shorten).
soak: stack
	$(PY) bench/soak.py $(SOAK_ARGS)

down:
	-test -x $(EOSINK) && $(EOSINK) stack down
	-test -x $(EOSINK) && test -d $(SECURE_HOME) && EOSINK_HOME=$(SECURE_HOME) $(EOSINK) stack down

clean: down
	rm -rf .eosink .eosink-secure
