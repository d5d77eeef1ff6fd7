# Two commands do all the set-up on a fresh Debian machine with Python 3.11:
#   make demo   -- installs everything, runs recipes/demo.yaml into runs/demo
#   make test   -- installs everything, runs the test suite
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
WORDNET_FILE := $(or $(WNHOME),/usr/share/wordnet)/data.noun

.PHONY: demo test install wordnet clean

install: $(STAMP) wordnet

# The venv is rebuilt only when pyproject.toml changes. torch goes in first, pinned to
# the CPU build on disk, so no dependency pulls a multi-GB CUDA build from the index.
$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; install Python 3.11 (Debian: apt-get install python3.11 python3.11-venv)"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[dev]"
	@touch $(STAMP)

# WordNet 3.0 comes from Debian's wordnet-base.
wordnet:
	@if [ ! -f "$(WORDNET_FILE)" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing WordNet 3.0 (Debian package wordnet-base)"; \
	    (apt-get install -y -qq wordnet-base >/dev/null 2>&1 || \
	     (apt-get update -qq >/dev/null && apt-get install -y -qq wordnet-base >/dev/null)) || \
	     { echo "error: could not install wordnet-base; run: apt-get install wordnet-base"; exit 1; }; \
	  else \
	    echo "error: WordNet 3.0 not found at $(WORDNET_FILE); install it with: sudo apt-get install wordnet-base (or set WNHOME to its dict folder)"; exit 1; \
	  fi; \
	fi

demo: install
	$(BIN)/compressor run recipes/demo.yaml --out runs/demo
	@echo "report: runs/demo/report.json"

# Two workers, one test file each at a time (module fixtures are built once): most tests
# keep one core busy, so two workers use the two cores of the target machine.
test: install
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

clean:
	rm -rf $(VENV) runs .pytest_cache
