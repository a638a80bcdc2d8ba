# The workbook's commands. Every target that needs Python creates .venv from nothing when it is missing.
#   make run    -- execute every notebook (solutions and unsolved labs) into build/, ledger + report
#   make test   -- pytest on tests/, nbval on solutions/, execution of the unsolved labs/
#   make lab    -- JupyterLab on the workbook
#   make test-browser -- every lab (and three solutions) run in JupyterLab in headless Chromium, widgets moved
#   make hub    -- JupyterHub for a class (ROSTER=learners.txt), make collect LAB=NN to grade it (INSTRUCTOR.md 4)
PROFILE ?= auto
LABS ?=
FORCE ?=
STRICT ?=
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export PYTHONHASHSEED := 0
# Bytecode cached in __pycache__ (git ignores it) even where the environment turns it off: the tests start hundreds of
# Python processes that import the workbook, and pytest rewrites every test module on each run without it (a worker's
# collection: 12.6 s without, 8 s with, on a 2-core Zen 1)
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup run test test-fast test-browser nbval lab labs check-sync refresh baseline gpu-check grade hub collect \
	clean

$(VENV)/.installed: pyproject.toml scripts/setup_venv.sh
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/setup_venv.sh
	touch $@

setup: $(VENV)/.installed

run: $(VENV)/.installed
	$(PY) -m common run --profile "$(PROFILE)" --labs "$(LABS)" $(if $(STRICT),--strict)

# nbval's kernels: tests/jupyter/kernels/python3-warm, forked from a server per pytest worker that has imported torch
# and friends once (tests/warm_kernels.py; without the server, e.g. under `make nbval`, an ordinary kernel)
NBVAL := --nbval --nbval-kernel-name python3-warm --nbval-sanitize-with tests/nbval_sanitize.cfg --nbval-cell-timeout=600
TEST_KERNELS := JUPYTER_PATH=$(CURDIR)/tests/jupyter$(if $(JUPYTER_PATH),:$(JUPYTER_PATH))

# Two workers (one per core). --dist loadscope keeps each notebook's nbval cells (one module) in one worker and
# kernel, and spreads the unsolved-lab runs (one class each in tests/test_notebooks.py).
JOBS ?= 2

test: $(VENV)/.installed
	bash scripts/sandbox_setup.sh
	$(TEST_KERNELS) WORKBOOK_HEADLESS=1 WORKBOOK_PROFILE=quick $(PY) -m pytest tests solutions $(NBVAL) -p no:cacheprovider \
		-n $(JOBS) --dist loadscope --durations=15

# JupyterLab in headless Chromium (Playwright): Run All on every lab and three solutions, every widget control moved.
# Installs Playwright into the venv and, as root, Debian's chromium. Screenshots of failures: build/browser/.
test-browser: $(VENV)/.installed
	bash scripts/browser_setup.sh $(PY)
	bash scripts/sandbox_setup.sh
	bash scripts/hub_setup.sh $(PY)
	WORKBOOK_BROWSER=1 $(PY) -m pytest tests/test_browser.py tests/test_hub_class.py -p no:cacheprovider -v -s

# Instructor: grade learners' notebooks, DIR/<learner>/NN_name.ipynb -> build/grades/ (grades.csv, summary.md, the
# executed notebooks), each in a bubblewrap sandbox (installed here as root when missing; see INSTRUCTOR.md).
#   make grade DIR=submissions [CELL_TIMEOUT=120] [NOTEBOOK_TIMEOUT=600] [GRADE_JOBS=2] [ROSTER=learners.txt]
CELL_TIMEOUT ?= 120
NOTEBOOK_TIMEOUT ?= 600
GRADE_JOBS ?= 1
ROSTER ?=
grade: $(VENV)/.installed
	$(if $(DIR),,$(error make grade needs DIR=<folder of learners' notebooks>, e.g. make grade DIR=submissions))
	WORKBOOK_NEED_SANDBOX=1 bash scripts/sandbox_setup.sh
	$(PY) -m common grade "$(DIR)" --out build/grades --cell-timeout $(CELL_TIMEOUT) \
		--notebook-timeout $(NOTEBOOK_TIMEOUT) --jobs $(GRADE_JOBS) $(if $(ROSTER),--roster "$(ROSTER)")

# Instructor: a JupyterHub for a class on this machine (INSTRUCTOR.md section 4). Each learner on the roster (one name
# per line) logs in with a password the hub makes (build/hub/passwords.csv) and works in their own copy of the labs,
# in a sandbox, with cores / learners threads and their share of memory and GPUs. As root: a Unix user per learner.
#   make hub ROSTER=learners.txt [IP=0.0.0.0] [PORT=8000] [IDLE_MINUTES=60] [THREADS=0] [MEMORY_MB=0] [GPUS=auto]
#            [GPU_SHARING=1] [PROFILE=quick] [SSL_CERT=... SSL_KEY=...]
#   make collect LAB=00 [GRADE_JOBS=2]  -- every learner's lab 00 into build/hub/collected/00/<learner>/, then graded
IP ?= 127.0.0.1
PORT ?= 8000
HUB_PORT ?= 8081
IDLE_MINUTES ?= 60
THREADS ?= 0
MEMORY_MB ?= 0
GPUS ?= auto
GPU_SHARING ?=
SSL_CERT ?=
SSL_KEY ?=
LAB ?=
hub: $(VENV)/.installed
	$(if $(ROSTER),,$(error make hub needs ROSTER=<file of learner names, one per line>, e.g. make hub ROSTER=learners.txt))
	bash scripts/sandbox_setup.sh
	bash scripts/hub_setup.sh $(PY)
	$(PY) -m common hub start --roster "$(ROSTER)" --ip $(IP) --port $(PORT) --hub-port $(HUB_PORT) \
		--idle-minutes $(IDLE_MINUTES) --threads $(THREADS) --memory-mb $(MEMORY_MB) --gpus "$(GPUS)" \
		--profile "$(PROFILE)" \
		$(if $(GPU_SHARING),--gpu-sharing) $(if $(SSL_CERT),--ssl-cert "$(SSL_CERT)" --ssl-key "$(SSL_KEY)")

collect: $(VENV)/.installed
	$(if $(LAB),,$(error make collect needs LAB=<lab number>, e.g. make collect LAB=00))
	bash scripts/sandbox_setup.sh
	$(PY) -m common hub collect --lab "$(LAB)" --grades build/grades --cell-timeout $(CELL_TIMEOUT) \
		--notebook-timeout $(NOTEBOOK_TIMEOUT) --jobs $(GRADE_JOBS)

# nbval alone: re-execute the solutions and compare their deterministic outputs with the committed ones.
nbval: $(VENV)/.installed
	$(TEST_KERNELS) WORKBOOK_HEADLESS=1 WORKBOOK_PROFILE=quick $(PY) -m pytest solutions $(NBVAL) -p no:cacheprovider

test-fast: $(VENV)/.installed
	$(PY) -m pytest tests -m "not notebooks" -p no:cacheprovider

lab: $(VENV)/.installed
	$(VENV)/bin/jupyter lab --notebook-dir=.

labs: $(VENV)/.installed
	$(PY) -m common labs --labs "$(LABS)" $(if $(FORCE),--force)

check-sync: $(VENV)/.installed
	$(PY) -m common check-sync

# Maintainer: re-execute solutions in place (quick profile) to refresh their committed reference outputs,
# then regenerate labs/.
refresh: $(VENV)/.installed
	$(PY) -m common refresh --labs "$(LABS)"
	$(PY) -m common labs --labs "$(LABS)"

# Record this machine's baseline, build/baselines/<fingerprint>.json: the solutions run RUNS times (default 3), each
# measured result stored with its median and a band from its own spread, the machine probe's with its band (the
# first `make run` records a one-run baseline by itself). FROM_LAST=1: from the last `make run` only. Maintainers:
# REFERENCE=1 writes the committed data/baselines/<device>.json instead (deterministic results only; they are judged
# on every machine).
REFERENCE ?=
FROM_LAST ?=
RUNS ?= 3
baseline: $(VENV)/.installed
	$(PY) -m common baseline --runs $(RUNS) --profile "$(PROFILE)" --labs "$(LABS)" \
		$(if $(REFERENCE),--reference) $(if $(FROM_LAST),--from-last)

# On a GPU machine: the kernels' notebooks at full size, and the benchmarks, results under $${OUT:-build/gpu}.
gpu-check: $(VENV)/.installed
	bash scripts/gpu_check.sh

clean:
	rm -rf build
