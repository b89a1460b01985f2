# Two commands do all the set-up on a machine with only python3 and make:
#   make demo   -- create .venv, install, run the main example
#   make test   -- create .venv, install with test extras, run the suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test onnx-test lint wheel-check fuzz bench bench-peers gpu-check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,onnx,viz,bench,cuda,lint,packaging,examples,distributed]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	NUMBA_ENABLE_CUDASIM=1 $(PY) -m pytest tests

# ONNX's backend node tests of every op of the import table, on the reference interpreter
# and (all of them, not make test's subset) on the compiled CPU target, with counts per op
onnx-test: $(STAMP)
	NUMBA_ENABLE_CUDASIM=1 GRADCOMPILER_ONNX_CONFORMANCE=full $(PY) -m pytest -q \
		tests/onnx_io/test_onnx_conformance.py tests/onnx_io/test_onnx_gradient_operator.py

# ruff with the rules chosen in pyproject.toml, on the whole tree
lint: $(STAMP)
	$(VENV)/bin/ruff check .

# the wheel and the sdist built, the wheel installed into a fresh virtualenv, the demo and a
# compile + run from outside the repository
wheel-check: $(STAMP)
	scripts/check_wheel.sh $(PY)

# random graphs: FUZZ_EXAMPLES checked against finite differences and compiled for the CPU
# (half as many for the CUDA simulator), drawn from FUZZ_SEED (printed; pass it to replay a
# run), within FUZZ_SECONDS (0: no limit); prints the counts
FUZZ_EXAMPLES ?= 2000
FUZZ_SECONDS  ?= 0
# drawn once (:=): a recursive variable would draw anew at each use, printing another seed
ifndef FUZZ_SEED
FUZZ_SEED     := $(shell $(PYTHON) -c 'import random; print(random.randrange(2**32))')
endif
fuzz: $(STAMP)
	@echo "fuzz: seed $(FUZZ_SEED), $(FUZZ_EXAMPLES) examples, time limit $(FUZZ_SECONDS) s"
	NUMBA_ENABLE_CUDASIM=1 HYPOTHESIS_PROFILE=fuzz GRADCOMPILER_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) \
		GRADCOMPILER_FUZZ_SECONDS=$(FUZZ_SECONDS) \
		$(PY) -m pytest tests/hardening/test_fuzz_random_graphs.py -q -s --disable-warnings \
		--hypothesis-seed=$(FUZZ_SEED)

# OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE (set on some machines for old OpenBLAS builds) halve
# numpy's SGEMM on a current one: unset for the measurement alone; the report names the kernel
bench: $(STAMP)
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(VENV)/bin/gradcompiler bench \
		--json bench-results/bench.json --markdown bench-results/bench.md --plot bench-results/bench.png
	$(VENV)/bin/gradcompiler bench --scaling --json bench-results/scaling.json --plot bench-results/scaling.png

# on a machine with an NVIDIA GPU: the CUDA tests on the device and the suite with --target cuda
GPU_CHECK_OUT ?= gpu-check-results
gpu-check: $(STAMP)
	PY=$(PY) scripts/gpu_check.sh $(GPU_CHECK_OUT)

bench-peers: $(STAMP)
	$(PY) -m pip install -q 'torch==2.13.0' jax jaxlib || echo "some peers are not available from the registry"

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
