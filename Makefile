# eosink: the two set-up commands are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
PY_SYS ?= python3
VENV := .venv
PY := $(VENV)/bin/python
EOSINK := $(VENV)/bin/eosink
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)

.PHONY: venv stack demo test down bench clean

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

down:
	-test -x $(EOSINK) && $(EOSINK) stack down

clean: down
	rm -rf .eosink
