# The two commands the README opens with. Both create .venv with Python 3.11+
# and install the project, so they work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: sim demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

# The main job: a default simulation (3 networks x 3 hosts crawling a synthetic web).
sim: $(STAMP)
	$(BIN)/dedupnet sim

demo: $(STAMP)
	$(BIN)/dedupnet demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/bench_store.py
	$(BIN)/python bench/bench_protocol.py
	$(BIN)/python bench/bench_crawler.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
