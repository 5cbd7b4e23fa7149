# The README's two commands, `make quickstart` and `make test`, with all their set-up.
# On first use each creates .venv with Python 3.11 and runs scripts/install.sh into it; a stamp
# file (.venv/.installed) lets later runs reuse it, and a change to pyproject.toml, the
# requirements or the install script re-runs the install. Missing system tools are reported with
# the command that installs them.
#   make quickstart                      # SFT -> GRPO-RoC -> held-out eval on the toy task
#   make quickstart ARGS="--compare-grpo --seeds 0,1,2"
#   make test                            # the whole test suite (what .ci/run runs)
#   make test ARGS="tests/quickstart"    # a part of it
#   make rehearsal                       # the SLURM template on two stand-in nodes, on CPU (docs/scale-out.md)
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3 || echo python3.11)
VENV ?= .venv
STAMP := $(VENV)/.installed
OUT ?= runs/quickstart
REHEARSAL_OUT ?= runs/rehearsal-$(shell date +%Y%m%d-%H%M%S)
ARGS ?=
APT_HINT := apt-get install bubblewrap redis-server

.PHONY: help quickstart test rehearsal install system-check

help:
	@echo "make quickstart   the whole recipe on the toy task (ARGS=\"--compare-grpo --seeds 0,1,2\", OUT=$(OUT))"
	@echo "make test         the test suite (ARGS=\"tests/quickstart\" for a part)"
	@echo "make rehearsal    slurm_rl.sbatch as shipped on two stand-in nodes on CPU: stage 1 -> 2 -> eval (REHEARSAL_OUT=$(REHEARSAL_OUT))"
	@echo "make install      only create $(VENV) and install (done by the two above on first use)"

install: $(STAMP)

$(STAMP): pyproject.toml $(wildcard requirements/*.txt) scripts/install.sh
	@v=$$("$(PYTHON)" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || \
	  { echo "error: no Python found ($(PYTHON)); install Python 3.11: apt-get install python3.11 python3.11-venv" >&2; exit 1; }; \
	  [[ $$v == 3.11 ]] || echo "warning: $(PYTHON) is Python $$v; rstar2 is tested on 3.11 (PYTHON=python3.11 make ...)" >&2
	@[[ -x $(VENV)/bin/python ]] || "$(PYTHON)" -m venv $(VENV) || \
	  { echo "error: could not create $(VENV); install the venv module: apt-get install python3.11-venv" >&2; exit 1; }
	@echo "installing rstar2 into $(VENV) (scripts/install.sh; first run only, a few minutes)"
	@start=$$(date +%s); PYTHON=$(VENV)/bin/python bash scripts/install.sh 2> >(grep -v "^WARNING: Location" >&2); \
	  echo "install took $$(( $$(date +%s) - start )) s"
	@touch $@

# Not fatal: without them the sandbox falls back to a weaker jail and the jail and Redis tests
# skip. But say so, with the one command that installs them.
system-check:
	@missing=""; command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	  command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	  if [[ -n $$missing ]]; then \
	    echo "warning: missing system tools:$$missing (the sandbox's bubblewrap jail, the multi-node queue;" \
	         "their tests will skip). Install them with: $(APT_HINT)" >&2; fi

quickstart: $(STAMP) system-check
	$(VENV)/bin/rstar2 quickstart --out $(OUT) $(ARGS)

test: $(STAMP) system-check
	$(VENV)/bin/python -m pytest -q $(ARGS)

rehearsal: $(STAMP) system-check
	$(VENV)/bin/python tests/rehearsal/rehearsal.py --out $(REHEARSAL_OUT)
