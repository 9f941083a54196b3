# The two commands: `make demo` and `make test`. Both create .venv when it is missing.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# the suite mostly waits on real daemons (partitions, restarts, training), so two workers overlap the waits
TEST_WORKERS ?= 2

.PHONY: demo test bench lint typecheck check mosquitto chromium bytecode clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# torch first, pinned, so that pip takes the CPU wheel on disk and never pulls a CUDA build.
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,dev]'
	@touch $(STAMP)

# Where PYTHONDONTWRITEBYTECODE is set (CI machines, containers) Python keeps no bytecode of the project's
# own modules, so every daemon, model program and swci it starts compiles them again (0.2-0.3 s of CPU for
# a daemon). Written here at each make; a module edited since is compiled in memory, as without it.
bytecode: $(STAMP)
	@$(PY) -m compileall -q -j 0 swci daemons contracts taskdefs certs swarmlearning wire runscripts examples bench tests

# mosquitto is the broker the tests and the demo run; the code falls back to amqtt without it.
mosquitto:
	@if ! command -v mosquitto >/dev/null && ! test -x /usr/sbin/mosquitto; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get install -y -q mosquitto || (apt-get update -q && apt-get install -y -q mosquitto)) >/dev/null; \
	  else echo "mosquitto is missing: install it (apt-get install mosquitto) or tests use the amqtt fallback"; fi; \
	fi
	@# the multihost tests build hosts from network namespaces with `ip` (iproute2)
	@if ! command -v ip >/dev/null && ! test -x /usr/sbin/ip; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get install -y -q iproute2 || (apt-get update -q && apt-get install -y -q iproute2)) >/dev/null; \
	  else echo "ip (iproute2) is missing: the multihost tests will be skipped"; fi; \
	fi

# Debian's headless chromium and its driver run the dashboard's browser test (skipped, saying so, without).
chromium:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    (apt-get install -y -q chromium chromium-driver || (apt-get update -q && apt-get install -y -q chromium chromium-driver)) >/dev/null; \
	  else echo "chromium is missing: install it (apt-get install chromium chromium-driver) or the browser test skips"; fi; \
	fi

demo: $(STAMP) mosquitto bytecode
	$(PY) examples/mnist-pyt/run_demo.py

test: $(STAMP) mosquitto chromium bytecode
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

bench: $(STAMP) mosquitto bytecode
	$(PY) bench/run_all.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

check: lint typecheck

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
	find . -name __pycache__ -prune -exec rm -rf {} +
