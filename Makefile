# eosink: the two set-up commands are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
PY_SYS ?= python3
VENV := .venv
PY := $(VENV)/bin/python
EOSINK := $(VENV)/bin/eosink
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)

.PHONY: venv stack demo test down clean bench $(BENCHES)

$(STAMP):
	@test -x $(PY) || $(PY_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

venv: $(STAMP)

stack: venv
	$(EOSINK) stack up

demo: stack
	$(EOSINK) demo

test: stack
	$(PY) -m pytest $(PYTEST_ARGS)

# Benchmarks (ratios against a baseline measured in the same script): `make bench-worker`, ...
BENCHES := bench-worker bench-cluster bench-postgres bench-s3 bench-http bench-iceberg bench-spark
bench: $(BENCHES)
bench-worker: stack
	$(PY) bench/bench_worker.py $(BENCH_ARGS)
bench-cluster: stack
	$(PY) bench/bench_cluster.py $(BENCH_ARGS)
bench-postgres: stack
	$(PY) bench/bench_postgres_sink.py $(BENCH_ARGS)
bench-s3: stack
	$(PY) bench/bench_s3_sink.py $(BENCH_ARGS)
bench-http: stack
	$(PY) bench/bench_http_sink.py $(BENCH_ARGS)
bench-iceberg: stack
	$(PY) bench/bench_iceberg_sink.py $(BENCH_ARGS)
bench-spark: stack
	$(PY) bench/bench_spark_publisher.py $(BENCH_ARGS)

down:
	-test -x $(EOSINK) && $(EOSINK) stack down

clean: down
	rm -rf .eosink
