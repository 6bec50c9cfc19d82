# make test      lint (ruff), types (mypy), then the CPU suite (creates .venv on first use; torch
#                pinned to the CPU build 2.13.0)
# make test-engine  the engine adapter's tests, against an installed sglang 0.5.23 (own venv)
# make engine-matrix the engine scenarios on sglang 0.5.20-0.5.23 and vllm 0.13.0, 0.16.0, 0.17.0, 0.23.0,
#                0.24.0, 0.27.0, 0.28.0, each release in its own process
# make test-vllm  the vLLM adapter's and connector-check's tests on each vLLM release (own venv)
# make engine-pack   .engines/carry: sglang 0.5.22 and 0.5.23, vllm 0.16.0 and 0.17.0 for a GPU host
#                with no package index (PACK_ENGINES chooses the engines)
# make engine-from-pack  on that GPU host: the engine scenarios on each release of the pack (sglang's and
#                vllm's), on the host's own torch (nothing installed into its interpreter)
# make run       the default scenario set: on the GPU when torch sees one, else on the CPU simulator
#                (which skips the natural set's serving shapes, scenarios/natural.toml)
# make gpu-test  the pull-request gate: GPU tests + every scenario of the default, faults and
#                write-back sets as a test item + the mutant kill matrix, on a runner that already
#                has torch (no install step)
# make gpu-nightly  what the gate leaves out: soaks, the natural set, the kill matrix at 1,000
#                replays, the bench sweep, the sanitizer studies
# make bench     fence strategies: correctness on every race scenario, then their cost; then how fast
#                the harness checks replays against the device time of what it checks; then what
#                harness.sanitizer costs per replay (GPU only)
# make gpu-verdicts  on a GPU runner: the simulator's costs (harness/records/sim_costs.json), then the
#                GPU's verdicts that the simulator's fidelity test compares
# make gpu-samples   on a GPU runner: the committed samples (reports/samples/*-h200) regenerated

VENV      ?= .venv
VPY       := $(VENV)/bin/python
REPORTS   ?= reports
# The interpreter of a GPU runner: its own torch, nothing installed.
PYTHON    ?= python3
# find_spec, not import: importing torch takes seconds, on every make command.
HAS_TORCH := $(shell $(PYTHON) -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)' \
	>/dev/null 2>&1 && echo yes)

.PHONY: test test-engine test-vllm engine-matrix engine-pack engine-from-pack run gpu-test gpu-nightly gpu-verdicts gpu-samples bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q -e '.[dev]'
	touch $@

test: $(VENV)/.installed
	$(VENV)/bin/ruff check harness tests
	$(VENV)/bin/mypy
	$(VPY) -m pytest -q -m "not gpu" -n 2

# The engine adapter's tests, in their own venv: sglang 0.5.23 pins torch 2.14.1, not the CPU
# path's 2.13.0, so `make test` stays light. sglang itself goes in with --no-deps (see pyproject).
ENGINE_VENV ?= .venv-engine
EPY         := $(ENGINE_VENV)/bin/python

$(ENGINE_VENV)/.installed: pyproject.toml
	python3 -m venv $(ENGINE_VENV)
	$(EPY) -m pip install -q --upgrade pip
	$(EPY) -m pip install -q torch==2.14.1 torchvision==0.29.1
	$(EPY) -m pip install -q -e '.[dev,sglang]'
	$(EPY) -m pip install -q --no-deps sglang==0.5.23
	touch $@

test-engine: $(ENGINE_VENV)/.installed
	$(EPY) -m pytest -q -m "not gpu" -p no:cacheprovider tests/engines/test_sglang.py tests/engines/test_sglang_cow.py \
		tests/engines/test_sglang_host_hit.py tests/frontends/test_engine_matrix.py tests/engines/test_hybrid_releases.py

# Each release installed with pip --no-deps --target $(ENGINES_DIR)/sglang-VERSION beside the engine
# venv (its deps: the `.[sglang]` extra), then run in its own process; one table, one results.json.
# On the simulator the models are shrunk and each scenario runs ENGINE_REPLAYS times.
ENGINES_DIR     ?= .engines
# vLLM's (below): defined before engine-matrix, whose prerequisites expand as make reads them.
VLLM_VENV     ?= .venv-vllm
VLPY          := $(VLLM_VENV)/bin/python
VLLM_RELEASES ?= 0.13.0,0.16.0,0.17.0
# The releases either side of vllm#46278 (SimpleCPUOffloadConnector's store ordered after the compute
# stream, first in 0.24.0; the connector is in 0.19.0 on): scenarios/engine/vllm_simple_offload.toml and
# its tests (0.24.0 on refuse the extra's Transformers 4: engine-matrix --install-only puts Transformers 5
# in such a release's own folder).
VLLM_SIMPLE_RELEASES ?= 0.23.0,0.24.0
# The releases either side of vllm#50696 (the offloading load ordered after the compute stream, first
# in 0.28.0): their offloading worker is a module of its own, which scenarios/engine/vllm_offload_load.toml
# and the offload tests drive (the connector contract's config needs a newer Transformers than the
# extra's: engine-matrix runs that file alone on them).
VLLM_LOAD_RELEASES ?= 0.27.0,0.28.0
VLLM_ALL_RELEASES = $(VLLM_RELEASES),$(VLLM_SIMPLE_RELEASES),$(VLLM_LOAD_RELEASES)
ENGINE_RELEASES ?= 0.5.20,0.5.21,0.5.22,0.5.23
ENGINE_REPLAYS  ?= 10
engine-matrix: $(ENGINE_VENV)/.installed $(VLLM_VENV)/.installed
	$(EPY) -m harness engine-matrix --releases $(ENGINE_RELEASES) --engines-dir $(ENGINES_DIR) \
		--device auto --replays $(ENGINE_REPLAYS) --out $(REPORTS)/engine-matrix
	$(VLPY) -m harness engine-matrix --engine vllm --releases $(VLLM_ALL_RELEASES) \
		--engines-dir $(ENGINES_DIR) --device auto --replays $(ENGINE_REPLAYS) --out $(REPORTS)/engine-matrix

# vLLM: the releases either side of vllm-project/vllm#31057 (requires_piecewise_for_cudagraph, and
# VllmConfig's FULL-to-PIECEWISE downgrade for it, first in 0.17.0), and 0.13.0, before #31341 (the
# offloading store's wait on the compute stream, first in 0.14.0). Each installed once with
# pip --no-deps --target $(ENGINES_DIR)/vllm-VERSION beside one venv: the CPU torch of `make test` and
# the `.[vllm]` extra. Results: $(REPORTS)/engine-matrix/vllm-VERSION/results.json, merged in vllm/.

$(VLLM_VENV)/.installed: pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VLPY) -m pip install -q --upgrade pip
	$(VLPY) -m pip install -q torch==2.13.0
	$(VLPY) -m pip install -q -e '.[dev,vllm]'
	touch $@

# The adapter's, connector-check's and the vLLM pack's tests, once per release folder (installed as
# engine-matrix installs them; on 0.17.0 the pack's test also simulates a GPU host on the CPU,
# downloading the pack's wheels for this CPython); required: a test module that cannot import what it
# drives fails here, where elsewhere it skips.
VLLM_TEST = FENCE_HARNESS_VLLM_TEST=required PYTHONPATH=$(ENGINES_DIR)/vllm-$$v $(VLPY) -m pytest -q -m "not gpu" \
	-p no:cacheprovider
test-vllm: $(VLLM_VENV)/.installed
	$(VLPY) -m harness engine-matrix --engine vllm --releases $(VLLM_ALL_RELEASES) --engines-dir $(ENGINES_DIR) \
		--install-only || exit 2
	for v in $(subst $(comma),$(space),$(VLLM_RELEASES)); do \
		$(VLLM_TEST) tests/engines/test_vllm.py tests/engines/test_vllm_offload.py \
			tests/frontends/test_connector_check.py tests/frontends/test_engine_pack_vllm.py || exit 1; \
	done
	for v in $(subst $(comma),$(space),$(VLLM_SIMPLE_RELEASES)); do \
		$(VLLM_TEST) tests/engines/test_vllm_simple_offload.py || exit 1; \
	done
	for v in $(subst $(comma),$(space),$(VLLM_LOAD_RELEASES)); do \
		$(VLLM_TEST) tests/engines/test_vllm_offload.py tests/engines/test_vllm_simple_offload.py || exit 1; \
	done

# For a GPU host with no package index: .engines/carry holds each release's imported files, stubs
# of its compiled-kernel packages and the wheels the GPU image lacks, per engine (PACK_ENGINES):
# sglang-VERSION, stubs, wheels (harness/frontends/engine_pack.py); vllm-VERSION, stubs-vllm,
# wheels-vllm and wheels-vllm/transformers (harness/frontends/engine_pack_vllm.py). Each part's size
# is printed; carry what the run needs (one engine's folders, see docs/engines.md).
PACK_ENGINES        ?= sglang vllm
PACK_SGLANG_RELEASES ?= 0.5.22,0.5.23
PACK_VLLM_RELEASES  ?= 0.16.0,0.17.0
engine-pack: $(if $(filter sglang,$(PACK_ENGINES)),$(ENGINE_VENV)/.installed) \
	$(if $(filter vllm,$(PACK_ENGINES)),$(VLLM_VENV)/.installed)
	$(if $(filter sglang,$(PACK_ENGINES)),$(EPY) -m harness engine-pack --releases $(PACK_SGLANG_RELEASES) \
		--engines-dir $(ENGINES_DIR))
	$(if $(filter vllm,$(PACK_ENGINES)),$(VLPY) -m harness engine-pack --engine vllm --releases $(PACK_VLLM_RELEASES) \
		--engines-dir $(ENGINES_DIR))

# On the GPU host, with the pack brought over (one release's folder with its engine's stubs and wheels
# is enough): per engine, the wheels go into a temporary folder (pip --no-index --no-deps --target; it
# goes when the run ends), which joins that engine's stubs on PYTHONPATH, and engine-matrix runs every
# release of the pack from its folder on the host's own torch: sglang's (PACK_RELEASES: the
# sglang-VERSION folders), then vllm's (PACK_VLLM: the vllm-VERSION folders, `--engine vllm`; the
# carried Transformers is installed only where the host's own is outside a release's range, and the
# command says which runs). Set either to empty to leave that engine out. PACK_REPLAYS: replays a
# scenario (empty: each scenario's own); PACK_DEVICE sim runs it on the simulator (shrunk models)
# instead. Results: $(REPORTS)/engine-matrix (sglang) and $(REPORTS)/engine-matrix/vllm-VERSION
# (merged in vllm/). Exit: the worse of the two engines' (2 before 1).
PACK          ?= $(ENGINES_DIR)/carry
PACK_RELEASES ?= $(subst $(space),$(comma),$(strip $(patsubst $(PACK)/sglang-%,%,$(wildcard $(PACK)/sglang-*))))
PACK_VLLM     ?= $(subst $(space),$(comma),$(strip $(patsubst $(PACK)/vllm-%,%,$(wildcard $(PACK)/vllm-*))))
PACK_REPLAYS  ?=
PACK_DEVICE   ?= cuda
empty :=
space := $(empty) $(empty)
comma := ,
engine-from-pack:
	@test -n "$(PACK_RELEASES)$(PACK_VLLM)" || \
	{ echo "make: no sglang-VERSION or vllm-VERSION folder in $(PACK): make engine-pack where pip reaches the index, then bring it" >&2; \
	exit 2; }
	@rc=0; \
	if [ -n "$(PACK_RELEASES)" ]; then \
		tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
		if ls $(PACK)/wheels/*.whl >/dev/null 2>&1; then \
			$(PYTHON) -m pip install -q --no-index --no-deps --target "$$tmp" $(PACK)/wheels/*.whl || \
			{ echo "make: the pack's wheels (CPython 3.12, manylinux x86_64) do not install on $(PYTHON)" >&2; exit 2; }; \
		fi && \
		PYTHONPATH="$$tmp:$(abspath $(PACK))/stubs:$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(PYTHON) -m harness \
			engine-matrix --releases $(PACK_RELEASES) --engines-dir $(PACK) --device $(PACK_DEVICE) \
			$(if $(PACK_REPLAYS),--replays $(PACK_REPLAYS)) --out $(REPORTS)/engine-matrix || rc=$$?; \
	fi; \
	if [ -n "$(PACK_VLLM)" ]; then \
		vtmp=$$(mktemp -d) && trap 'rm -rf "$$tmp" "$$vtmp"' EXIT && \
		wheels=$$(PYTHONPATH="$(CURDIR)" $(PYTHON) -m harness engine-pack --engine vllm --host-wheels $(PACK)) || exit 2; \
		if [ -n "$$wheels" ]; then \
			$(PYTHON) -m pip install -q --no-index --no-deps --target "$$vtmp" $$wheels || \
			{ echo "make: the pack's vLLM wheels (CPython 3.12, manylinux x86_64) do not install on $(PYTHON)" >&2; exit 2; }; \
		fi && \
		PYTHONPATH="$$vtmp:$(abspath $(PACK))/stubs-vllm:$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(PYTHON) -m harness \
			engine-matrix --engine vllm --releases $(PACK_VLLM) --engines-dir $(PACK) --device $(PACK_DEVICE) \
			$(if $(PACK_REPLAYS),--replays $(PACK_REPLAYS)) --out $(REPORTS)/engine-matrix || \
			{ r=$$?; [ $$r -eq 2 -o $$rc -eq 0 ] && rc=$$r; }; \
	fi; \
	exit $$rc

ifeq ($(HAS_TORCH),yes)
run:
	PYTHONPATH=. $(PYTHON) -m harness run --device auto --out $(REPORTS)
else
run: $(VENV)/.installed
	$(VPY) -m harness run --device auto --out $(REPORTS)
endif

# One pytest worker per GPU (pytest-xdist, when the runner has it and more than one GPU): workers
# sharing one GPU share its timing, and race rates move. worksteal: an idle worker takes items
# from a busy one, so one slow scenario does not leave the other GPUs idle at the end.
# The GPUs CUDA_VISIBLE_DEVICES leaves (else every GPU nvidia-smi lists), counted without starting
# Python: the plugin pins each worker to one (harness/frontends/gpu_workers.py).
GPU_WORKERS = $(shell if [ -n "$$CUDA_VISIBLE_DEVICES" ]; then echo "$$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .; \
	else nvidia-smi -L 2>/dev/null | grep -c '^GPU'; fi)
XDIST       = $(shell [ $(GPU_WORKERS) -gt 1 ] && $(PYTHON) -c 'import xdist' 2>/dev/null && echo -p xdist -n $(GPU_WORKERS) --dist worksteal)

# The pull-request gate, one pytest session: every GPU test but the nightly ones, one test item per
# scenario of the default, faults and write-back sets, and one per variant of the mutant kill matrix
# (--harness-mutants), each with the graph check inside, spread over the GPUs as one pool of items.
# GATE_REPLAYS replays per scenario item, by what an item must show (tests/support/replays.py says
# why): a race under the gate shows in every replay, and 30 clean replays bound a missed wait's
# per-replay rate below 10% at 95% confidence; the analysis and the graph check prove the ordering
# whatever the timing. It writes results.json (the kill matrix as its mutants section), summary.md and
# junit.xml (partial, if stopped), and appends summary.md to $GITHUB_STEP_SUMMARY when set.
# GPU_TEST_ARGS: more pytest arguments (a CI matrix's --harness-shard K/N, say).
GATE_REPLAYS  ?= 30
GATE_SETS     = $(filter-out scenarios/natural.toml,$(wildcard scenarios/*.toml))
GPU_TEST_ARGS ?=
# The GPU tests live in tests/gpu, but for the replay model's, which runs on both devices.
GATE_TESTS    = tests/gpu tests/run/test_replay_model.py
gpu-test:
	mkdir -p $(REPORTS)
	PYTHONPATH=. $(PYTHON) -m pytest -q -m "gpu and not nightly" -p no:cacheprovider -p harness.frontends.pytest_plugin \
		$(XDIST) --junitxml=$(REPORTS)/junit.xml --harness-device cuda --harness-report $(REPORTS) \
		--harness-replays $(GATE_REPLAYS) --harness-scenarios $(GATE_SETS) \
		--harness-mutants $(wildcard scenarios/mutants/*.toml) $(GPU_TEST_ARGS) $(GATE_TESTS)

# What moved out of the gate, each part writing its results and report under $(NIGHTLY):
# the nightly GPU tests (1,000-replay soaks, PyTorch's sanitizer on the harness); every scenario
# of scenarios/*.toml, the natural set at serving shapes included, at each scenario's own replay count;
# the kill matrix at 1,000 replays; the strategy check, the fence bench sweep (to 80 layers, every
# arm) and the checking speed; the sanitizer studies; the release matrix from a pack when
# .engines/carry is there (make engine-pack makes it on a host with an index). The run, the kill
# matrix and the bench are the committed samples' own commands (make gpu-samples).
NIGHTLY ?= $(REPORTS)/nightly
BENCH_POINTS ?= sweep,layers
# 10 timed rounds an arm after 3 warm-up ones (the sweep and the 80-layer point in about four minutes
# on an H200): the medians' spread is in the output (IQR).
BENCH_ARGS   ?= --points $(BENCH_POINTS) --repeats 10 --warmup 3
gpu-nightly:
	mkdir -p $(NIGHTLY)
	PYTHONPATH=. $(PYTHON) -m pytest -q -m "gpu and nightly" -p no:cacheprovider -p harness.frontends.pytest_plugin \
		$(XDIST) --junitxml=$(NIGHTLY)/junit.xml --harness-device cuda --harness-report $(NIGHTLY)/tests tests/gpu
	PYTHONPATH=. $(PYTHON) -m harness run --device cuda --out $(NIGHTLY)/run
	PYTHONPATH=. $(PYTHON) -m harness mutants --device cuda --replays 1000 --out $(NIGHTLY)/mutants
	PYTHONPATH=. $(PYTHON) -m harness fences --device cuda --out $(NIGHTLY)/fences
	PYTHONPATH=. $(PYTHON) -m harness bench --device cuda $(BENCH_ARGS) --out $(NIGHTLY)/bench
	PYTHONPATH=. $(PYTHON) -m harness checking --device cuda --out $(NIGHTLY)/checking
	PYTHONPATH=. $(PYTHON) -m harness sanitizer cost --out $(NIGHTLY)/sanitizer
	PYTHONPATH=. $(PYTHON) -m harness sanitizer compare --log $(NIGHTLY)/sanitizer-compare.log \
		> $(NIGHTLY)/sanitizer-compare.txt; rc=$$?; cat $(NIGHTLY)/sanitizer-compare.txt; exit $$rc
	PYTHONPATH=. $(PYTHON) -m harness sanitizer check > $(NIGHTLY)/sanitizer-check.txt; \
		rc=$$?; cat $(NIGHTLY)/sanitizer-check.txt; exit $$rc
	if [ -d $(PACK) ]; then $(MAKE) engine-from-pack PACK_REPLAYS=1000 REPORTS=$(NIGHTLY); fi

# The simulator's costs measured (calibrate), then every scenario of scenarios/*.toml, the fidelity
# set and the kill matrix on the GPU, on a quiet device (another process's work moves the timing
# races): tests/run/test_fidelity.py checks the
# simulator against this file, which records the GPU, driver and torch it came from. The natural
# set is for GPUs only (the simulator skips it), so there is nothing for the simulator to agree on.
VERDICT_FILES = $(filter-out scenarios/natural.toml,$(wildcard scenarios/*.toml)) scenarios/fidelity/shared.toml \
	$(wildcard scenarios/mutants/*.toml)
gpu-verdicts:
	PYTHONPATH=. $(PYTHON) -m harness calibrate
	PYTHONPATH=. $(PYTHON) -m harness run $(VERDICT_FILES) --device cuda --out $(REPORTS)/verdicts
	cp $(REPORTS)/verdicts/results.json tests/data/gpu_verdicts.json

# The committed samples (reports/samples/*-h200, docs/results.md#sample-reports), regenerated on a
# GPU runner from this checkout: each folder emptied, then written by the command it records, with
# paths relative to the checkout (tests/report/test_samples.py checks both). Where the tree is a copy
# without git, COMMIT (or GITHUB_SHA) names the commit the samples record.
SAMPLES ?= reports/samples
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
gpu-samples:
	rm -rf $(SAMPLES)/gpu-test-h200 $(SAMPLES)/default-h200 $(SAMPLES)/mutants-h200 $(SAMPLES)/bench-h200
	GITHUB_SHA=$(COMMIT) $(MAKE) gpu-test REPORTS=$(SAMPLES)/gpu-test-h200
	GITHUB_SHA=$(COMMIT) PYTHONPATH=. $(PYTHON) -m harness run --device cuda --out $(SAMPLES)/default-h200
	GITHUB_SHA=$(COMMIT) PYTHONPATH=. $(PYTHON) -m harness mutants --device cuda --replays 1000 --out $(SAMPLES)/mutants-h200
	GITHUB_SHA=$(COMMIT) PYTHONPATH=. $(PYTHON) -m harness bench --device cuda $(BENCH_ARGS) --out $(SAMPLES)/bench-h200

# What each correct fence costs (device events; the whole sweep on a GPU, the default point on the
# simulator), and every strategy against every full-graph race scenario.
ifeq ($(HAS_TORCH),yes)
bench:
	PYTHONPATH=. $(PYTHON) -m harness fences --device auto --out $(REPORTS)/fences
	PYTHONPATH=. $(PYTHON) -m harness bench --device auto --out $(REPORTS)/bench
	PYTHONPATH=. $(PYTHON) -m harness checking --device auto --out $(REPORTS)/checking
	PYTHONPATH=. $(PYTHON) -m harness sanitizer cost --out $(REPORTS)/sanitizer
else
bench: $(VENV)/.installed
	$(VPY) -m harness fences --device auto --replays 5 --out $(REPORTS)/fences
	$(VPY) -m harness bench --device auto --points default --repeats 20 --out $(REPORTS)/bench
	$(VPY) -m harness checking --device auto --replays 5 --runs 1 --out $(REPORTS)/checking
endif

clean:
	rm -rf $(VENV) $(ENGINE_VENV) $(VLLM_VENV) $(ENGINES_DIR) build *.egg-info .pytest_cache
