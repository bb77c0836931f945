# SpeedInfer. `make run` serves the embedded demo; `make test` runs the suite on PostgreSQL and Redis.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8000
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/speedinfer
TEST_REDIS_URL ?= redis://127.0.0.1:6379/0
# The real Triton server for tests: nvidia-pytriton's tritonserver in a venv of its own, made with Debian's
# python3.11 because the Python backend stub links its libpython (see docs/testing.md).
TRITON_VENV ?= $(HOME)/.cache/speedinfer/triton-venv
TRITON_PYTHON ?= /usr/bin/python3.11

.PHONY: install install-dev run test lint bench clean help triton chromium gpu-check

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed ## create .venv with the runtime dependencies

install-dev: $(VENV)/.installed-dev ## .venv plus test and lint tools

run: install ## migrate, seed the demo and serve at http://127.0.0.1:$(PORT)
	$(PY) manage.py migrate --noinput -v 0
	$(PY) manage.py seeddemo
	PORT=$(PORT) $(PY) manage.py rundemo --port $(PORT)

# PYTEST_ARGS reach the first pass, e.g. PYTEST_ARGS='-m "not slow and not triton"' for a quick run.
# --dist load: loadgroup groups nothing under pytest 9.2 with xdist 3.8 (xdist_group marks are ignored).
test: install-dev triton chromium ## the whole suite against PostgreSQL and Redis
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} REDIS_URL=$${REDIS_URL:-$(TEST_REDIS_URL)} \
	SECRET_KEY=$${SECRET_KEY:-test-secret-key} DEBUG=0 ALLOWED_HOSTS='*' \
	$(VENV)/bin/pytest -n 2 --dist load $(PYTEST_ARGS)
	@# The money path again on the embedded default's SQLite (the ORM path; PostgreSQL runs single statements):
	@# the tests marked `sqlite` (pyproject.toml's markers).
	env -u DATABASE_URL -u REDIS_URL SPEEDINFER_VAR_DIR=$$(mktemp -d) SECRET_KEY=test-secret-key DEBUG=0 ALLOWED_HOSTS='*' \
	$(VENV)/bin/pytest -q -p no:cacheprovider -m sqlite

triton: $(TRITON_VENV)/.installed ## the real Triton server the tests start (cached venv)

$(TRITON_VENV)/.installed:
	test -x $(TRITON_VENV)/bin/python || $(TRITON_PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/python -m pip install -q nvidia-pytriton==0.7.0
	# The backend stub breaks every BYTES tensor under numpy 2, so force 1.x over whatever pytriton pulled in.
	$(TRITON_VENV)/bin/python -m pip install -q --no-deps --force-reinstall numpy==1.26.4
	SP=$(TRITON_VENV)/lib/python3.11/site-packages/pytriton/tritonserver; \
	mkdir -p $(TRITON_VENV)/backends/python && \
	ln -sf $$SP/backends/python/libtriton_python.so $$SP/backends/python/triton_python_backend_utils.py \
		$$SP/python_backend_stubs/3.11/triton_python_backend_stub $(TRITON_VENV)/backends/python/
	touch $@

bench: install-dev ## gateway vs direct path: latency, throughput, streaming, memory (BENCH_ARGS=...)
	command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(PY) bench/run.py $(BENCH_ARGS)

gpu-check: install-dev ## SpeedInfer + real Triton on an NVIDIA GPU, end to end (GPU_CHECK_ARGS=--dry-run without one)
	env -u DATABASE_URL -u REDIS_URL $(PY) devtools/gpu_check.py $(GPU_CHECK_ARGS)

chromium: ## Debian's chromium for the browser test (Playwright's own browser download fails here)
	@test -x /usr/bin/chromium || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

lint: install-dev ## ruff, mypy, the import-linter layer contracts and the docs site (strict: a broken link fails)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mkdocs build --strict --quiet

clean: ## remove the venv and local state
	rm -rf $(VENV) var
