# Two commands do all the set-up on a machine with only python3 and make:
#   make demo   -- create .venv, install, run the main example
#   make test   -- create .venv, install with test extras, run the suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-profiles onnx-test lint wheel-check fuzz bench bench-avx2 bench-peers gpu-check clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,onnx,viz,bench,cuda,lint,packaging,examples,distributed]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# the whole suite on both cores, every buffer fenced by guard bytes (GRADCOMPILER_CHECK_BOUNDS);
# PYTHONHASHSEED fixed so that both workers collect the same parametrised tests
test: $(STAMP)
	PYTHONHASHSEED=0 NUMBA_ENABLE_CUDASIM=1 GRADCOMPILER_CHECK_BOUNDS=1 $(PY) -m pytest -n 2 tests

# the tests of the code whose shape depends on the CPU, and the demo, again under the AVX2 profile
# (NUMBA_CPU_NAME=haswell with the features its name implies: Numba generates AVX2 code on any
# x86-64 host), with the bounds check; the products also under the baseline x86-64 profile (SSE2,
# no FMA) inside test_gemm.py
CPU_KERNEL_TESTS := tests/backends/test_gemm.py tests/backends/test_direct_conv.py \
	tests/backends/test_conv_kernels.py tests/backends/test_long_sum_accuracy.py \
	tests/backends/test_vector_width.py tests/backends/test_bounds_check.py tests/backends/test_cpu_profile.py
AVX2 := NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES= GRADCOMPILER_CHECK_BOUNDS=1
test-profiles: $(STAMP)
	$(AVX2) PYTHONHASHSEED=0 NUMBA_ENABLE_CUDASIM=1 $(PY) -m pytest -n 2 $(CPU_KERNEL_TESTS)
	$(AVX2) $(PY) examples/demo.py --steps 5 --dot ''

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
# run), within FUZZ_SECONDS (0: no limit), failing below FUZZ_MIN_COMPILED graphs compiled for
# the CPU; prints the counts; every buffer fenced by guard bytes
FUZZ_EXAMPLES ?= 2000
FUZZ_SECONDS  ?= 0
FUZZ_MIN_COMPILED ?= 0
# drawn once (:=): a recursive variable would draw anew at each use, printing another seed
ifndef FUZZ_SEED
FUZZ_SEED     := $(shell $(PYTHON) -c 'import random; print(random.randrange(2**32))')
endif
fuzz: $(STAMP)
	@echo "fuzz: seed $(FUZZ_SEED), $(FUZZ_EXAMPLES) examples, time limit $(FUZZ_SECONDS) s"
	NUMBA_ENABLE_CUDASIM=1 HYPOTHESIS_PROFILE=fuzz GRADCOMPILER_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) GRADCOMPILER_CHECK_BOUNDS=1 \
		GRADCOMPILER_FUZZ_SECONDS=$(FUZZ_SECONDS) GRADCOMPILER_FUZZ_MIN_COMPILED=$(FUZZ_MIN_COMPILED) \
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

# the same suite under the AVX2 profile, each peer held to AVX2 in the same run: Numba generates
# AVX2 code (NUMBA_CPU_NAME=haswell with the features its name implies), torch dispatches its
# AVX2 kernels (ATEN_CPU_CAPABILITY) and oneDNN, which torch's convolutions and XLA's products
# may call, is capped at AVX2 (ONEDNN_MAX_CPU_ISA), numpy's OpenBLAS runs its Haswell kernel and
# XLA's own code is capped at AVX2; no first calls (the native run measures them)
AVX2_PEERS := NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES= ATEN_CPU_CAPABILITY=avx2 OPENBLAS_CORETYPE=Haswell \
	ONEDNN_MAX_CPU_ISA=AVX2 XLA_FLAGS=--xla_cpu_max_isa=AVX2
bench-avx2: $(STAMP)
	env -u OPENBLAS_L2_SIZE $(AVX2_PEERS) $(VENV)/bin/gradcompiler bench --no-first-call \
		--json bench-results/bench-avx2.json --markdown bench-results/bench-avx2.md

bench-peers: $(STAMP)
	$(PY) -m pip install -q 'torch==2.13.0' jax jaxlib || echo "some peers are not available from the registry"

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
