# spec-cookbook. `make tune` and `make test` each set up what they need on a fresh
# machine. Without a CUDA torch: a .venv with CPU torch 2.13.0, triton 3.6.0 and the
# extras, NumPy kept below 2.4 for the Triton interpreter. With a CUDA torch importable:
# that Python's environment, into which the extras are installed (pip's default strategy
# upgrades nothing that is already satisfied, and no pin there lowers a version; pip's
# usual PIP_INDEX_URL / PIP_FIND_LINKS settings apply).
PY_SYS    ?= python3
VENV      ?= .venv
TORCH_CPU ?= torch==2.13.0
TRITON    ?= triton==3.6.0
HAS_CUDA  := $(shell $(PY_SYS) -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1 && echo 1)
ifeq ($(HAS_CUDA),1)
  PY := $(PY_SYS)
  SETUP := build/.extras-installed
else
  PY := $(VENV)/bin/python
  SETUP := $(VENV)/.installed
endif
PYTEST_ARGS ?=
# pytest-xdist workers: one a core, at most 8 (the interpreter's tests are CPU-bound)
PYTEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 8 ] && n=8; echo $$n)

.PHONY: install test test-gpu tune quality bench bench-compare targets example-bench lint clean

$(VENV)/.installed: pyproject.toml
	$(PY_SYS) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q "$(TORCH_CPU)" "$(TRITON)"
	$(VENV)/bin/pip install -q -e ".[tune,dev,interpreter,examples]"
	touch $@

build/.extras-installed: pyproject.toml
	$(PY_SYS) -m pip install -q -e ".[tune,dev,examples]"
	@mkdir -p build && touch $@

install: $(SETUP)

# CPU (Triton interpreter) or CUDA, whichever this machine has.
test: $(SETUP)
	@$(PY) -m pytest -q -n $(PYTEST_WORKERS) $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5)" >&2; fi; exit $$rc

# The same suite with compiled kernels; fails if no GPU is visible.
test-gpu: $(SETUP)
	$(PY_SYS) -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 'test-gpu: no CUDA device visible')"
	@SPEC_TEST_DEVICE=cuda $(PY_SYS) -m pytest -q -n $(PYTEST_WORKERS) $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test-gpu: pytest collected no tests (exit 5)" >&2; fi; exit $$rc

# The default key set on this GPU -> results/<gpu>/<recipe>.json and tune-report.json;
# without a GPU, a labelled smoke tune under the Triton interpreter into
# results/cpu-interpreter/. (e.g. TUNE_ARGS="--recipe argmax"; `python -m autotune tune -h`,
# `... tune --list` for the recipes and keys; `spec-cookbook` is the same command installed)
TUNE_ARGS ?=
tune: $(SETUP)
	$(PY) -m autotune tune $(TUNE_ARGS)

# How good the search is: exhaustive optimum vs the tuner's search on >= 12 keys
# -> results/<gpu>/tuner-quality.md (resumable: run it again if it was stopped).
QUALITY_ARGS ?=
quality: $(SETUP)
	$(PY) -m autotune quality $(QUALITY_ARGS)

# Every recipe's benchmark on this GPU -> results/<gpu>/BENCH.md, plots, OVERHEAD.md
# (e.g. BENCH_ARGS="--budget-s 540"); without a GPU, a smoke functional check only.
BENCH_ARGS ?=
bench: $(SETUP)
	$(PY) -m autotune bench $(BENCH_ARGS)

# The speculative decoding example (examples/spec_decode.py): its whole decode step as one
# CUDA graph, recipes vs plain torch -> results/<gpu>/spec-decode.md and .json (B in
# {1,4,16,64}, K=3, two runs each); without a GPU, a tiny smoke run (-h lists the options)
EXAMPLE_ARGS ?=
example-bench: $(SETUP)
	$(PY) examples/spec_decode.py --bench $(EXAMPLE_ARGS)

# The issues' speed targets against a committed benchmark run -> $(RESULTS)/TARGETS.md
# and $(RESULTS)/targets.json (its header and inputs, then per target id, target, measured,
# met; null with a reason if unknown)
RESULTS ?= results/h200
targets: $(SETUP)
	$(PY) -m autotune.targets $(RESULTS) > $(RESULTS)/TARGETS.md.tmp && mv $(RESULTS)/TARGETS.md.tmp $(RESULTS)/TARGETS.md

# A bench run against an earlier one, config for config: $(RESULTS) as committed at BASE
# (a git revision) vs the working tree's (python -m autotune.bench.compare -h)
BASE ?= HEAD
bench-compare: $(SETUP)
	@d=$$(mktemp -d) && git archive "$(BASE)" $(RESULTS) | tar x -C $$d \
	  && $(PY) -m autotune.bench.compare $$d/$(RESULTS) $(RESULTS) \
	       --base-name "$(RESULTS) at $(BASE)"; rc=$$?; rm -rf $$d; exit $$rc

lint: $(SETUP)
	$(PY) -m ruff check recipes autotune tests examples tools

clean:
	rm -rf $(VENV) build .pytest_cache
