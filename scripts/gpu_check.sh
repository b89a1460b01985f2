#!/usr/bin/env bash
# make gpu-check: on a machine with an NVIDIA GPU, run the CUDA backend's tests on the device
# itself (not on Numba's simulator, which is what make test uses), profile a few steps' calls
# and run the benchmark suite with --target cuda; keep everything they print and write in one
# folder.
#
#   scripts/gpu_check.sh [OUT_DIR]          OUT_DIR, else $GPU_CHECK_OUT, else gpu-check-results
#   BENCH_ARGS="--quick --no-first-call" scripts/gpu_check.sh    extra options for the suite
#   PY=python3 scripts/gpu_check.sh         another interpreter (default .venv/bin/python, else
#                                           python3); the checkout is installed into it (editable)
#                                           if it is not already
#   TEST_TIMEOUT=300 BENCH_TIMEOUT=300      seconds each part may run (default: no limit;
#   MODEL_BENCH_TIMEOUT=300                 BENCH_TIMEOUT for the kernel workloads, MODEL_... for
#                                           the cnn and gpt training steps)
#
#   BENCH_GRAPHS=1                          also run the suite with GRADCOMPILER_CUDA_GRAPHS=1
#
# Writes OUT_DIR/device.txt (the GPU and the versions found), cuda-tests.log and cuda-tests.xml
# (pytest, JUnit), profile.txt (host against device time per call), profile-unbound.txt (the
# same with GRADCOMPILER_CUDA_PREBIND=0: every launch through Numba's dispatcher),
# profile-graphs.txt (the same with GRADCOMPILER_CUDA_GRAPHS=1), bench-cuda.log,
# bench-cuda.json, bench-cuda.md and bench-cuda.png (the kernel workloads),
# bench-cuda-models.{log,json,md} (cnn and gpt) (with BENCH_GRAPHS=1 also
# bench-cuda-graphs.{log,json,md}). Exits 2 without a usable GPU, 1 if a test
# or the suite failed, 0 otherwise; every part runs even when an earlier one failed.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT=${1:-${GPU_CHECK_OUT:-gpu-check-results}}
mkdir -p "$OUT"
export NUMBA_ENABLE_CUDASIM=0 GRADCOMPILER_GPU_CHECK=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# passes/ imports as gradcompiler.passes only through the package's install (pyproject's
# package-dir): on a machine where $PY has not installed this checkout, install it editable.
if ! "$PY" -c "import gradcompiler.passes" 2>/dev/null; then
    "$PY" -m pip install -q --no-deps --no-build-isolation --no-index -e . \
        || { echo "gpu-check: cannot install this checkout into $PY's environment" >&2; exit 2; }
fi
limit() { if [ -n "$1" ]; then echo "timeout $1"; fi; }

if ! "$PY" - > "$OUT/device.txt" 2>&1 <<'PYEOF'
from gradcompiler.backends.numba_cuda import require_cuda

cuda = require_cuda()
device = cuda.get_current_device()
name = getattr(device, "name", "unnamed device")
print(name.decode() if isinstance(name, bytes) else name,
      "compute capability", ".".join(map(str, device.compute_capability)))
import importlib.metadata as metadata
import platform
for package in ("numpy", "numba", "numba-cuda", "llvmlite", "cuda-bindings", "torch", "jax", "cupy-cuda13x"):
    try:
        print(f"{package} {metadata.version(package)}")
    except metadata.PackageNotFoundError:
        print(f"{package} not installed")
print("python", platform.python_version())

# Compile and run one kernel before anything else: a numba-cuda that cannot compile (seen with
# numpy 2.5 beside numba-cuda 0.30, which calls the removed np.row_stack) fails every test.
import numpy as np
from gradcompiler.bench.cuda_triad import triad
try:
    a, b, c = (cuda.to_device(np.full(64, v, np.float32)) for v in (0.0, 1.0, 2.0))
    triad[1, 64](a, b, c, np.float32(3.0))
    assert (a.copy_to_host() == 7.0).all(), "the probe kernel computed a wrong result"
except Exception as err:
    raise SystemExit(f"numba-cuda cannot compile or run a kernel here: {type(err).__name__}: {err}")
print("probe kernel: compiled and ran")
PYEOF
then
    cat "$OUT/device.txt"
    echo "gpu-check needs a CUDA GPU; without one, make test runs these tests on the simulator" >&2
    exit 2
fi
echo "GPU: $(cat "$OUT/device.txt")"

status=0
parallel=()
if "$PY" -c "import xdist" 2>/dev/null; then parallel=(-n "${TEST_WORKERS:-8}"); fi
# shellcheck disable=SC2046  # limit prints a command and its argument, or nothing
$(limit "${TEST_TIMEOUT:-}") "$PY" -m pytest "${parallel[@]}" -k cuda \
    tests/backends/test_cuda_sim_library.py tests/backends/test_cuda_sim_graphs.py \
    tests/backends/test_cuda_sim_conv.py tests/backends/test_cuda_sim_conv_gemm.py \
    tests/backends/test_cuda_matmul_route.py tests/backends/test_cuda_launch.py \
    tests/hardening/test_bad_feeds_runtime.py tests/hardening/test_fuzz_random_graphs.py \
    tests/hardening/test_codegen_safety.py tests/hardening/test_debug_mode.py \
    tests/test_train_step.py tests/backends/test_sibling_calls.py \
    tests/backends/test_absorbed_gathers.py tests/backends/test_cuda_index_checker.py \
    --junitxml="$OUT/cuda-tests.xml" 2>&1 | tee "$OUT/cuda-tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

# shellcheck disable=SC2046
$(limit "${PROFILE_TIMEOUT:-}") "$PY" scripts/step_profile.py --target cuda --workload mlp \
    --workload attention --workload layernorm_gelu > "$OUT/profile.txt" 2>&1 || status=1

# launch overhead: the same profile with every launch through the dispatcher, and with CUDA graphs
# shellcheck disable=SC2046
GRADCOMPILER_CUDA_PREBIND=0 $(limit "${PROFILE_TIMEOUT:-}") "$PY" scripts/step_profile.py --target cuda \
    --workload mlp --workload attention --workload layernorm_gelu > "$OUT/profile-unbound.txt" 2>&1 || status=1
# shellcheck disable=SC2046
GRADCOMPILER_CUDA_GRAPHS=1 $(limit "${PROFILE_TIMEOUT:-}") "$PY" scripts/step_profile.py --target cuda \
    --workload mlp --workload attention --workload layernorm_gelu > "$OUT/profile-graphs.txt" 2>&1 || status=1

# The kernel workloads, then the two models (cnn, gpt) on their own: a model that compiles or
# runs too long for MODEL_BENCH_TIMEOUT leaves the kernel workloads' figures written.
kernel_workloads=()
for name in $("$PY" -c "from gradcompiler.bench.workloads import NAMES; print(*NAMES)"); do
    case $name in cnn|gpt) ;; *) kernel_workloads+=(--workload "$name") ;; esac
done
# shellcheck disable=SC2086,SC2046  # BENCH_ARGS is a list of options
$(limit "${BENCH_TIMEOUT:-}") "$PY" -m gradcompiler.bench --target cuda "${kernel_workloads[@]}" ${BENCH_ARGS:-} \
    --json "$OUT/bench-cuda.json" --markdown "$OUT/bench-cuda.md" --plot "$OUT/bench-cuda.png" 2>&1 \
    | tee "$OUT/bench-cuda.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
# shellcheck disable=SC2086,SC2046
$(limit "${MODEL_BENCH_TIMEOUT:-}") "$PY" -m gradcompiler.bench --target cuda --workload cnn --workload gpt \
    ${BENCH_ARGS:-} --json "$OUT/bench-cuda-models.json" --markdown "$OUT/bench-cuda-models.md" 2>&1 \
    | tee "$OUT/bench-cuda-models.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

if [ "${BENCH_GRAPHS:-0}" = 1 ]; then
    # shellcheck disable=SC2086,SC2046
    GRADCOMPILER_CUDA_GRAPHS=1 $(limit "${BENCH_TIMEOUT:-}") "$PY" -m gradcompiler.bench --target cuda \
        "${kernel_workloads[@]}" ${BENCH_ARGS:-} \
        --json "$OUT/bench-cuda-graphs.json" --markdown "$OUT/bench-cuda-graphs.md" 2>&1 \
        | tee "$OUT/bench-cuda-graphs.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

echo "gpu-check: results in $OUT (status $status)"
exit $status
