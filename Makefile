# Two commands for a fresh machine (Linux, Python 3.9+):
#   make demo   install clusterddp with what the example needs, run a 2-node x 2-rank DDP job on this machine
#   make test   install what the tests need (Slurm 22.05 + 24.11 and munge when root, torch CPU build, pytest) and
#               run them all
PYTHON ?= python3
PIP = $(PYTHON) -m pip
# torch is pinned: an unpinned torch may pull a multi-GB CUDA build.
TORCH ?= torch==2.13.0

.PHONY: demo test lint install install-test cluster-up cluster-down bench gpu-check

install:
	$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e .

install-test: install
	$(PIP) install -q -e ".[test]"
	@if [ "$$(id -u)" = 0 ] && [ "$$(uname -s)" = Linux ]; then tests/slurm/cluster.sh install && \
		CLUSTERDDP_SLURM_RELEASE=24.11 tests/slurm/cluster.sh install; \
	else echo "not root on Linux: the Slurm tests will be skipped"; fi

demo: install
	$(PYTHON) -m clusterddp submit --local --nodes 2 --gpus 2 examples/train_ddp.py -- --epochs 2

# Lint first (seconds), then every test, the real-Slurm ones included.
test: install-test lint
	$(PYTHON) -m pytest -ra --durations=25

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy

# Benchmarks (not tests): hyperfine from Debian, torchx in its own venv for the comparison; results in bench/RESULTS.md.
bench: install
	@command -v hyperfine >/dev/null || { apt-get update -qq && apt-get install -y -qq hyperfine; }
	@[ -x bench/.venv-torchx/bin/torchx ] || { $(PYTHON) -m venv bench/.venv-torchx && bench/.venv-torchx/bin/pip install -q torchx; }
	$(PYTHON) -m bench

# On a machine with CUDA GPUs (and a CUDA build of torch): the NCCL path end to end; results in bench/RESULTS-gpu.md.
gpu-check:
	$(PIP) install -q -e ".[stacks]"
	$(PYTHON) bench/gpu_check.py

cluster-up:
	tests/slurm/cluster.sh up

cluster-down:
	tests/slurm/cluster.sh down
