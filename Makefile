# Two commands for a fresh machine (Linux, Python 3.9+):
#   make demo   install clusterddp with what the example needs, run a 2-node x 2-rank DDP job on this machine
#   make test   install what the tests need (Slurm 22.05 + 26.05 and munge when root, torch 2.13, pytest) and
#               run them all
#
# Where it installs: the virtual environment that is active (VIRTUAL_ENV or CONDA_PREFIX), else .venv here, made
# from the bare interpreter with `python3 -m venv` (no system site packages: what the project needs, it installs;
# nothing is inherited from the machine's Python). PYTHON=... chooses an interpreter outright.
BASE_PYTHON ?= python3
ifeq ($(origin PYTHON),undefined)
  ifneq ($(VIRTUAL_ENV)$(CONDA_PREFIX),)
    PYTHON := python3
  else
    VENV := .venv
    PYTHON := $(VENV)/bin/python
    # The venv's bin first, for every recipe: jobs run `python3` and `clusterddp` from PATH, as a user's would.
    export VIRTUAL_ENV := $(abspath $(VENV))
    export PATH := $(abspath $(VENV))/bin:$(PATH)
  endif
endif
PIP = $(PYTHON) -m pip
# torch is pinned to the release the job side is tested with. From PyPI on Linux that is the CUDA build (about 2.5 GB
# with NVIDIA's libraries) unless pip finds a CPU one (a local wheel); TORCH_INDEX=https://download.pytorch.org/whl/cpu
# takes it from PyTorch's CPU index.
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
# The torch already installed: "missing", "ok" (2.13 or newer, any build) or its version (older: kept, untested).
TORCH_FOUND = $(PYTHON) -c "import re, torch; m = re.match(r'(\d+)\.(\d+)', torch.__version__); \
	print('ok' if m and (int(m[1]), int(m[2])) >= (2, 13) else torch.__version__)" 2>/dev/null || echo missing
# torch 2.13's torchvision, for the public scripts tests/test_migrate.py runs (installed without its dependencies:
# it would ask for torch again).
TORCHVISION ?= torchvision==0.28.0

.PHONY: demo test test-serial test-fast test-release lint install install-test cluster-up cluster-down bench gpu-check \
	torch-found

ifdef VENV
$(VENV)/bin/python:
	$(BASE_PYTHON) -m venv $(VENV)
endif

# clusterddp[torch]: torch (pinned here only when missing: an installed CUDA build is kept) and numpy, which torch's
# wheels do not declare but import at start-up; [report]: matplotlib, for the plots of `clusterddp report`, which the
# demo's last lines suggest; [migrate]: libcst, for `clusterddp migrate`, the README's next block.
# A torch you have is never replaced: one older than 2.13 stays, and clusterddp goes in without its torch extra.
install: $(if $(VENV),$(VENV)/bin/python)
	@found=$$($(TORCH_FOUND)); \
	if [ "$$found" = missing ]; then $(PIP) install -q "$(TORCH)" $(if $(TORCH_INDEX),--index-url "$(TORCH_INDEX)") \
		&& $(PIP) install -q -e ".[torch,report,migrate]"; \
	elif [ "$$found" = ok ]; then $(PIP) install -q -e ".[torch,report,migrate]"; \
	else echo "clusterddp: torch $$found is installed, older than 2.13 (the release clusterddp is tested with): kept as" \
		"it is, not replaced; clusterddp goes in without its torch extra (untested with it)"; \
		$(PIP) install -q numpy -e ".[report,migrate]"; fi
	@# The package's bytecode, compiled once: an editable install compiles nothing, and where PYTHONDONTWRITEBYTECODE
	@# is set (CI machines often) every process (each rank, each command) would compile clusterddp again.
	@$(PYTHON) -m compileall -q clusterddp >/dev/null

# What install finds (the test of the three cases runs it).
torch-found:
	@$(TORCH_FOUND)

install-test: install
	@if [ "$$($(TORCH_FOUND))" = ok ]; then $(PIP) install -q -e ".[torch,test]"; \
	else $(PIP) install -q -e ".[test]"; fi  # (an older torch kept by install stays)
	$(PIP) install -q --no-deps "$(TORCHVISION)"
	@if [ "$$(id -u)" = 0 ] && [ "$$(uname -s)" = Linux ]; then tests/slurm/cluster.sh install && \
		CLUSTERDDP_SLURM_RELEASE=26.05 tests/slurm/cluster.sh install; \
	else echo "not root on Linux: the Slurm tests will be skipped"; fi
	@# The report's test opens it in a real headless browser (Debian's chromium, no network needed at test time).
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		{ apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; } || \
		echo "no chromium (apt-get install chromium as root): the report's browser test will be skipped"; }

demo: install
	$(PYTHON) -m clusterddp submit --local --nodes 2 --gpus 2 examples/train_ddp.py -- --epochs 2
	@echo
	@echo "Next: the same job on a Slurm cluster, 2 nodes x 8 GPUs:  clusterddp submit --nodes 2 --gpus 8 examples/train_ddp.py"
	@echo "      read the sbatch script first:                      clusterddp submit --dry-run --nodes 2 --gpus 8 examples/train_ddp.py"
	@echo "      what the job will be (ranks, environment):          clusterddp explain --nodes 2 --gpus 8 examples/train_ddp.py"
	@$(if $(VENV),echo "      (clusterddp is installed in $(VENV): . $(VENV)/bin/activate)",true)

# Lint first (seconds), then every test, the real-Slurm ones included: four pytest runs side by side (the tests
# without a cluster in two, and one per Slurm release, each release's cluster in a sandbox of its own: tests/run_both.py).
test: install-test lint
	$(PYTHON) tests/run_both.py -ra --durations=25

# Every test in one pytest run, one after the other (the releases' clusters one at a time): slower, one report.
test-serial: install-test lint
	$(PYTHON) -m pytest -ra --durations=25

# The cluster tests on one Slurm release, e.g. Debian 13's, which make test no longer runs: make test-release RELEASE=24.11
RELEASE ?= 24.11
test-release: install-test lint
	CLUSTERDDP_SLURM_RELEASE=$(RELEASE) tests/slurm/cluster.sh install
	$(PYTHON) -m pytest -ra -m slurm --slurm-release $(RELEASE)

# The edit loop: no cluster tests, none marked slow, none that starts a real job's ranks (make test runs them all).
test-fast: install-test lint
	$(PYTHON) -m pytest -ra -m "not slurm and not slow and not ranks" -q

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy

# Benchmarks (not tests): hyperfine from Debian, torchx in its own venv for the comparison; results in bench/RESULTS.md.
bench: install
	@command -v hyperfine >/dev/null || { apt-get update -qq && apt-get install -y -qq hyperfine; }
	@[ -x bench/.venv-torchx/bin/torchx ] || { $(BASE_PYTHON) -m venv bench/.venv-torchx && bench/.venv-torchx/bin/pip install -q torchx; }
	$(PYTHON) -m bench

# On a machine with CUDA GPUs (and a CUDA build of torch): the NCCL path end to end; results in bench/RESULTS-gpu.md.
# The machine's own python3 (its CUDA build of torch) unless a venv is active: a fresh .venv would fetch torch.
GPU_PYTHON := $(if $(VENV),$(BASE_PYTHON),$(PYTHON))
gpu-check:
	$(GPU_PYTHON) -m pip install -q --no-deps -e . && { $(GPU_PYTHON) -m pip install -q "py-spy==0.4.3" "matplotlib>=3.7" || true; }
	$(GPU_PYTHON) bench/gpu_check.py

cluster-up:
	tests/slurm/cluster.sh up

cluster-down:
	tests/slurm/cluster.sh down
