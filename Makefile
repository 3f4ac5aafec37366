# tracepipe: make targets for the whole workflow. `make help` lists them.
# Python: the active virtual environment's, else ./.venv's (made on first use); PY=... overrides.
ifdef VIRTUAL_ENV
PY      ?= python3
else
VENV    := .venv
PY      ?= $(VENV)/bin/python
endif
PIP     ?= $(PY) -m pip
SRC     ?= traces
OUT     ?= dataset
SQL     ?= select count(*) as events from events
J       ?= 2
NATIVE  ?= 1
SIZES   ?= 1000,2000
TEMPLATE ?=
SECTIONED ?=
DEMO    := data/demo
# test processes (pytest-xdist): every core up to four, each test file in one process (its module
# fixtures made once); CI's tests took 26.4 min in one process and 14.7 min in two on a 2-core host
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
PYTEST  := -m pytest -q -n $(TEST_JOBS) --dist loadfile
.DEFAULT_GOAL := help

help:            ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

install: $(VENV) ## install tracepipe and its test tools (editable) into the active venv, else ./.venv
	$(PIP) install -q -e '.[dev]'
	@$(MAKE) --no-print-directory native
	@$(PY) -m compileall -q pipeline >/dev/null   # an editable install is never byte-compiled: ~0.1 s a command where PYTHONDONTWRITEBYTECODE is set
	@command -v pyenv >/dev/null 2>&1 && pyenv rehash || true   # make the `tracepipe` script visible under pyenv
ifdef VENV
	@echo "tracepipe is installed in $(VENV): run '. $(VENV)/bin/activate' to use the tracepipe command"
endif

native:          ## build the optional compiled chunk builder (native/; needs a C++ compiler); never fails
ifeq ($(NATIVE),0)
	@$(PIP) uninstall -q -y tracepipe-native 2>/dev/null || true
	@echo "native chunk builder skipped (NATIVE=0): tracepipe reads with its Python builders"
else
	@if $(PIP) install -q ./native >native/.build.log 2>&1; then \
		echo "native chunk builder installed (tracepipe_native; TRACEPIPE_NATIVE=0 turns it off)"; \
	else \
		$(PIP) uninstall -q -y tracepipe-native >/dev/null 2>&1; \
		echo "native chunk builder not built (no C++ compiler? see native/.build.log): tracepipe reads with its Python builders"; \
	fi
endif

$(VENV):
	python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip

demo: install    ## install, generate the bundled example trace, flatten and analyze it
	$(PY) -m pipeline demo-trace $(DEMO)/example_trace.json.gz
	$(PY) -m pipeline flatten $(DEMO)/example_trace.json.gz -o $(DEMO)/flat
	$(PY) -m pipeline analyze $(DEMO)/flat/example_trace --top 8 --width $${COLUMNS:-100}

test: install    ## run the test suite (real-trace tests run when ../shared/traces exists); TEST_JOBS=0: in this one process
	$(PY) $(PYTEST)

lint:            ## ruff (lint and format check) and mypy
	$(PY) -m ruff check pipeline tests scripts bench
	$(PY) -m ruff format --check pipeline tests scripts bench
	$(PY) -m mypy

test-fast:       ## the tests without the slow ones
	$(PY) $(PYTEST) -m "not slow"

fuzz:            ## mutate real and synthetic traces through every command: make fuzz N=100000 [SEED=1]
	$(PY) tests/fuzz.py --n $(or $(N),1000) --seed $(or $(SEED),0)

install-oracle:  ## the CPU torch wheel (2.13.0): the FLOP oracle and the torch handler's tests then run in make test
	$(PIP) install -q torch==2.13.0

oracle: install-oracle  ## install the CPU torch wheel and run the FLOP-formula oracle tests
	$(PY) -m pytest -q tests/test_formulas_oracle.py

gloo-runs:       ## re-record the real 4-process gloo runs in tests/data/runs (needs torch: TORCH_PY=/path/to/python)
	$(or $(TORCH_PY),$(PY)) scripts/record_gloo_run.py --out tests/data/runs/gloo4
	$(or $(TORCH_PY),$(PY)) scripts/record_gloo_run.py --out tests/data/runs/gloo4_sub --subgroup 1,2
	$(PY) scripts/record_gloo_run.py --partial-of tests/data/runs/gloo4 --drop-rank 0 --out tests/data/runs/gloo4_partial

bench: install   ## flatten speed/memory vs orjson.loads on generated 1 GB and 2 GB traces (+ .gz); TEMPLATE=real.json.gz [SECTIONED=1] scales a real trace; then bench-archive and bench-compare
	$(PY) bench/bench.py --sizes $(SIZES) --gz $(if $(TEMPLATE),--template $(TEMPLATE) --workdir /tmp/tracepipe-bench-$(notdir $(TEMPLATE)) $(if $(SECTIONED),--sectioned))
	$(PY) bench/bench_archive.py -j $(J)
	$(PY) bench/bench_runs.py -j $(J)
	$(PY) bench/bench_compare.py -j $(J)

bench-runs:      ## ranks of 256 generated ranks x 10,000 collectives (first look, cached, dataset), of 256 and 1,024 from Extracts; batch of 256
	$(PY) bench/bench_runs.py -j $(J)

bench-peers:     ## tracepipe beside TraceLens and HTA on the same runs and traces (peers: sh scripts/peers_venvs.sh)
	$(PY) bench/bench_peers.py

bench-shapes:    ## check.py limit on every real trace's shape: each of ../shared/traces scaled to 1 GB, flatten vs a bare simdjson parse (~25 min)
	$(PY) bench/bench_shapes.py

bench-cores:     ## how many cores a command keeps busy, over time: CMD="tracepipe analyze TRACE" (default: the demo trace)
	@test -n "$(CMD)" -o -f $(DEMO)/example_trace.json.gz || $(PY) -m pipeline demo-trace $(DEMO)/example_trace.json.gz
	$(PY) bench/bench_cores.py -- $(or $(CMD),$(PY) -m pipeline analyze $(DEMO)/example_trace.json.gz --format json -o /dev/null)

bench-compare:   ## compare and trend on a dataset of 100 runs x 8 ranks, each vs query on the same dataset
	$(PY) bench/bench_compare.py -j $(J)

bench-archive:   ## batch of 10,000 small and of 20 large traces, files per 1,000 traces, query latency, each vs its single-trace/file baseline
	$(PY) bench/bench_archive.py -j $(J)

batch:           ## flatten a folder/archive of traces into a dataset (small parts merged at the end): make batch SRC=... OUT=... [J=2]
	$(PY) -m pipeline batch $(SRC) -o $(OUT) -j $(J)

compact:         ## merge a dataset's small part files into few large ones: make compact OUT=...
	$(PY) -m pipeline compact $(OUT)

install-cluster: $(VENV) ## the cluster engines (--engine ray, --engine dask) and their tests: the `cluster` extra
	$(PIP) install -q -e '.[dev,cluster]'

query:           ## SQL over a dataset: make query OUT=... SQL="select ..."
	$(PY) -m pipeline query $(OUT) "$(SQL)"

examples:        ## list the named example queries
	$(PY) -m pipeline query $(OUT) --list-examples

acceptance:      ## run the shared acceptance checks (needs ../shared)
	for c in flatten link report batch fresh; do $(PY) ../shared/acceptance/check.py $$c || exit 1; done

clean:           ## remove generated outputs
	rm -rf $(DEMO)/flat $(DEMO)/*.json.gz .pytest_cache

.PHONY: help install native install-cluster install-oracle demo test lint test-fast fuzz oracle gloo-runs bench bench-runs bench-peers bench-shapes bench-cores bench-compare bench-archive batch compact query examples acceptance clean

docs:            ## the documentation site into site/ (MkDocs, strict; reference pages generated from the code)
	@$(PY) -c "import mkdocs, material" 2>/dev/null || $(MAKE) install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict
	@echo "documentation: site/index.html"

docs-serve:      ## the documentation site at http://127.0.0.1:8000, rebuilt on every change
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve

.PHONY: docs docs-serve
