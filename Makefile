# The two commands the README opens with. Both create .venv with Python 3.11+
# and install the project, so they work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Three pytest workers (most of the suite's time is daemons and servers waiting, so a
# third keeps two cores busy); a test file stays on one worker (its module fixtures are
# set up once). `make test PARALLEL=` runs the suite serially.
PARALLEL ?= -n 3 --dist loadfile

.PHONY: sim demo test test-fast bench clean browser promtool

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,frontier]'
	touch $(STAMP)

# The main job: a default simulation (3 networks x 3 hosts crawling a synthetic web).
sim: $(STAMP)
	$(BIN)/dedupnet sim

demo: $(STAMP)
	$(BIN)/dedupnet demo

test: $(STAMP) browser promtool
	$(BIN)/ruff check dedupnet local_host center_host tests bench
	$(BIN)/mypy
	$(BIN)/python -m pytest -q $(PARALLEL)

# The inner loop: everything but the slow tier (tests/conftest.py SLOW_FILES).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" $(PARALLEL)

# tests/test_status_page.py drives the status page in headless Chromium. On a fresh
# machine (CI) running as root, Debian's chromium is installed if missing: best-effort
# and quiet, at most 15 minutes; without a browser that test is skipped and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    timeout 900 sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium' \
	    >/dev/null 2>&1; } || \
	  echo "make: no chromium (not root, no apt-get, or the install failed): the status page's browser test is skipped"

# tests/test_alerts.py checks the shipped alert rules (deploy/prometheus/) and a live
# daemon's /metrics with promtool, from Debian's prometheus package; installed the same
# way, when root and missing; without it those tests are skipped and say why.
promtool:
	@command -v promtool >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    timeout 900 sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus' \
	    >/dev/null 2>&1; } || \
	  echo "make: no promtool (not root, no apt-get, or the install failed): the alert rule and metrics checks are skipped"

bench: $(STAMP)
	$(BIN)/python bench/bench_store.py
	$(BIN)/python bench/bench_protocol.py
	$(BIN)/python bench/bench_crawler.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
