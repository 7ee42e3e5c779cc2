# One virtual environment at .venv serves the tests, the CLI and `pulumi up`
# (Pulumi.yaml points its runtime at it).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ftfleet-installed

.PHONY: setup test test-fast test-gpu demo plan drill bench bench-restore bench-titan bench-fleet chaos lint docs clean

$(STAMP): pyproject.toml setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]' 2>&1 \
	  | grep -v "is ignored: it is neither a file nor a directory" || true
	# In-process restart (trainer/inprocess/): nvidia-resiliency-ext without its NVML
	# packages (pynvml makes every `import torch` on a CPU box print a FutureWarning).
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt --no-deps \
	  nvidia-resiliency-ext psutil defusedxml 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
	$(PY) -c "import torch, pulumi_aws, moto; assert '+cpu' in torch.__version__ or not torch.cuda.is_available()"
	$(PY) -c "import nvidia_resiliency_ext.inprocess"
	touch $@

setup: $(STAMP)

## Lint and format check (ruff, configured in pyproject.toml), and docstrings that state
## contracts, not history (no dates, machine timings or pointers into the benchmark log).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m tests.tools.docstring_history

## The linters, then the whole test suite, both tiers (under 10 minutes on 2 cores; the
## README's and CI's command). Two workers (pytest-xdist, whole files per worker, so that
## a file's session fixtures are built once) finish well before one.
TEST_WORKERS ?= 2
test: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

## The inner loop: the unit tier only (no test that starts a process; tests/tiers.py makes
## a unit test that does fail), under 90 seconds on 2 cores.
test-fast: setup
	FTFLEET_TEST_TIER=fast $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not chaos and not integration"

## The GPU paths (tests/gpu: pinned staging ordered after the training stream, snapshots
## of device tensors, the trainer on NCCL stopped or SIGKILLed and resumed bit-identical).
## Skipped without a CUDA device, as in CI; run where a GPU is.
test-gpu: setup
	$(PY) -m pytest -q tests/gpu

## The main job, offline: the plan of every stack, then the trainer under fire (the drill).
demo: setup
	$(VENV)/bin/ftfleet plan --all
	$(PY) -m drill

## Every failure injected into a local training run, with a report (~3 minutes on 2 cores).
DRILL_ARGS ?=
drill: setup
	$(PY) -m drill $(DRILL_ARGS)

## Long fault-injection tests (pytest -m chaos), then goodput under a failure every T
## seconds: naive sync, async, ftfleet (see bench/goodput_bench.py).
CHAOS_ARGS ?=
chaos: setup
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[bench]' 2>&1 \
	  | grep -v "is ignored: it is neither a file nor a directory" || true
	$(PY) -m pytest -q -m chaos
	$(PY) bench/goodput_bench.py $(CHAOS_ARGS)

## The in-process fleet beside the torchrun fleet on simulated nodes (network namespaces
## as root), a failure every 120 s: about 20 minutes; raw results in bench/results/.
FLEET_ARGS ?= --mtbf 120 --failures 3 --boot 30 --steps 2600
bench-fleet: setup
	$(PY) bench/fleet_goodput.py $(FLEET_ARGS)

plan: demo

## Regenerate the generated docs (config reference, contract).
docs: setup
	$(PY) -m ftfleet.contract > docs/CONTRACT.md
	$(VENV)/bin/ftfleet config-reference --write docs/CONFIG.md

## Checkpoint benchmark: one model + AdamW state of 1.02 GiB (GPT d_model 1024, 4 layers,
## vocabulary 20,000), written under /tmp; raw results in bench/results/. It runs in
## .venv-titan when `make bench-titan` has built it, so that (d) torchtitan is measured.
bench: setup
	@py=$(PY); if [ -f $(TITAN_STAMP) ]; then py=$(TITAN_VENV)/bin/python; fi; \
	  echo "bench python: $$py"; \
	  $$py bench/checkpoint_bench.py --dir /tmp/ftfleet-bench --repeats 5 \
	    --d-model 1024 --layers 4 --vocab 20000 --threads 2

## Restore benchmark: the fast tier's restore against reading the checkpoint's bytes once,
## and against the two-pass restore it replaced, same state as `make bench`.
bench-restore: setup
	$(PY) bench/restore_bench.py --dir /tmp/ftfleet-restore-bench --repeats 7 \
	  --d-model 1024 --layers 4 --vocab 20000 --threads 2

## A second venv for the benchmark's (d): the trainer's deps, then torchtitan and only the
## packages its checkpoint and optimizer modules import (bench/requirements-titan.txt,
## --no-deps, so pip can neither replace torch nor pull torchtitan's ~40 other packages).
## `make test` and CI never build it.
TITAN_VENV := .venv-titan
TITAN_STAMP := $(TITAN_VENV)/.ftfleet-installed

$(TITAN_STAMP): pyproject.toml constraints.txt bench/requirements-titan.txt
	$(PYTHON) -m venv $(TITAN_VENV)
	$(TITAN_VENV)/bin/python -m pip install --quiet --disable-pip-version-check \
	  -c constraints.txt -e '.[trainer]' 2>&1 \
	  | grep -v "is ignored: it is neither a file nor a directory" || true
	$(TITAN_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
	  -c constraints.txt -r bench/requirements-titan.txt 2>&1 \
	  | grep -v "is ignored: it is neither a file nor a directory" || true
	$(TITAN_VENV)/bin/python -c "import torch, torchtitan.components.checkpoint, \
	  torchtitan.components.optimizer; assert torch.__version__ == '2.13.0+cpu', torch.__version__"
	touch $@

bench-titan: $(TITAN_STAMP)

clean:
	rm -rf $(VENV) $(TITAN_VENV) .pytest_cache build *.egg-info
