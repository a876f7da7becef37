# Every target sets up .venv itself: `make run` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-long lint bench bench-check chaos chaos-two-node upgrade-check proto sql clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,ray,agents,a2a,mcp]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/runcontrol up --dev

# Two pytest-xdist workers, each with its own PostgreSQL and Ray runtime (tests/conftest.py's
# session fixtures), each taking whole files (module fixtures stay in one process) in the order
# collected, the longest files first (LONGEST_FILES in tests/conftest.py); then the tests
# marked `alone` (timed against the wall clock) in one process, nothing else running.
# `make test TEST_WORKERS=` runs the first part in one process too. docs/testing.md.
TEST_WORKERS ?= -n 2 --dist loadfile --no-loadscope-reorder
test: $(STAMP)
	RUNCONTROL_RUN_SLOW=1 $(BIN)/python -m pytest -q $(TEST_WORKERS) -m "not alone" --durations=15
	RUNCONTROL_RUN_SLOW=1 $(BIN)/python -m pytest -q -m alone

# The long variants of what `make test` checks short (tests marked `long`: the SIGTERM drain
# under load on its own, every `runcontrol up` stop and kill case, the rate limit over 30 s).
test-long: $(STAMP)
	RUNCONTROL_RUN_SLOW=1 RUNCONTROL_RUN_LONG=1 $(BIN)/python -m pytest -q --timeout=3600 -m long

# The long chaos run (docs/reliability.md): CHAOS_RUNS runs while faults of every kind strike at
# random moments; the figures go to chaos-report.json. `make test` runs a short one (80 runs,
# one fault of each kind).
CHAOS_RUNS ?= 2000
chaos: $(STAMP)
	RUNCONTROL_RUN_SLOW=1 RUNCONTROL_CHAOS_RUNS=$(CHAOS_RUNS) RUNCONTROL_CHAOS_MODE=random \
		RUNCONTROL_CHAOS_REPORT=chaos-report.json $(BIN)/python -m pytest -q -s --timeout=0 tests/chaos

# The same on two Ray nodes (docs/reliability.md): one fault of each kind, the removal of the
# second node among them; the figures go to chaos-two-node-report.json. Not in `make test`.
CHAOS_TWO_NODE_RUNS ?= 200
chaos-two-node: $(STAMP)
	RUNCONTROL_RUN_SLOW=1 RUNCONTROL_CHAOS_NODES=2 RUNCONTROL_CHAOS_RUNS=$(CHAOS_TWO_NODE_RUNS) \
		RUNCONTROL_CHAOS_MODE=each RUNCONTROL_CHAOS_REPORT=chaos-two-node-report.json \
		$(BIN)/python -m pytest -q -s --timeout=0 tests/chaos

# The upgrade across migration 0033 with runs in flight (docs/operations.md): the previous
# release's service (its code from git: the clone needs its history) commits while this one
# migrates the live database, then this release's service replaces it and finishes every run;
# the chaos run's checks, the journal row by row. About three minutes; not in `make test`.
upgrade-check: $(STAMP)
	RUNCONTROL_RUN_SLOW=1 RUNCONTROL_RUN_LONG=1 RUNCONTROL_UPGRADE_REPORT=upgrade-report.json \
		$(BIN)/python -m pytest -q -s --timeout=0 tests/chaos/test_upgrade_across_0033.py

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

# `make bench` takes the short variants (a few minutes); `make bench BENCH_ARGS=` the full ones
# (docs/benchmarks.md).
BENCH_ARGS ?= --short
bench: $(STAMP)
	@command -v wrk >/dev/null || apt-get install -y -q wrk >/dev/null 2>&1 \
		|| echo "wrk is not installed: the HTTP figures use the (slower) httpx load generator"
	$(BIN)/python -m bench $(BENCH_ARGS)

# The benches in their tiny variants, checked for every figure (no thresholds): CI runs it
# beside `make test`, so the benches cannot rot (about three minutes).
bench-check: $(STAMP)
	RUNCONTROL_RUN_BENCH=1 $(BIN)/python -m pytest -q tests/unit/test_benches.py

# The gRPC stubs are generated from schemas/runcontrol.proto and checked in: run this after
# changing the .proto and commit the result.
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. \
		schemas/runcontrol.proto

# The SQL functions are written once (runcontrol/store/sql/<name>.sql, and the per-table writers
# rendered from runcontrol/store/tables.py): after changing one, this writes the migration that
# applies by name those whose text changed (migrations/versions/NNNN_functions.py); commit it
# with the change (tests/store/test_writers.py checks it).
sql: $(STAMP)
	$(BIN)/python -m runcontrol.store.functions

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
