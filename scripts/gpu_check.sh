#!/usr/bin/env bash
# make gpu-check: on a machine with an NVIDIA GPU, run the CUDA backend's tests on the device
# itself (not on Numba's simulator, which is what make test uses) and the benchmark suite with
# --target cuda, and keep everything they print and write in one folder.
#
#   scripts/gpu_check.sh [OUT_DIR]          OUT_DIR, else $GPU_CHECK_OUT, else gpu-check-results
#   BENCH_ARGS="--quick --no-first-call" scripts/gpu_check.sh    extra options for the suite
#
# Writes OUT_DIR/device.txt (the GPU found), cuda-tests.log and cuda-tests.xml (pytest, JUnit),
# bench-cuda.log, bench-cuda.json, bench-cuda.md and bench-cuda.png. Exits 2 without a usable
# GPU, 1 if a test or the suite failed, 0 otherwise; the suite runs even when a test failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${1:-${GPU_CHECK_OUT:-gpu-check-results}}
mkdir -p "$OUT"
export NUMBA_ENABLE_CUDASIM=0 GRADCOMPILER_GPU_CHECK=1

if ! "$PY" - > "$OUT/device.txt" 2>&1 <<'PYEOF'
from gradcompiler.backends.numba_cuda import require_cuda

cuda = require_cuda()
device = cuda.get_current_device()
name = getattr(device, "name", "unnamed device")
print(name.decode() if isinstance(name, bytes) else name,
      "compute capability", ".".join(map(str, device.compute_capability)))
PYEOF
then
    cat "$OUT/device.txt"
    echo "gpu-check needs a CUDA GPU; without one, make test runs these tests on the simulator" >&2
    exit 2
fi
echo "GPU: $(cat "$OUT/device.txt")"

status=0
"$PY" -m pytest tests/backends/test_cuda_sim_library.py tests/backends/test_cuda_sim_graphs.py -q \
    --junitxml="$OUT/cuda-tests.xml" 2>&1 | tee "$OUT/cuda-tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

# shellcheck disable=SC2086  # BENCH_ARGS is a list of options
"$PY" -m gradcompiler.bench --target cuda ${BENCH_ARGS:-} --json "$OUT/bench-cuda.json" \
    --markdown "$OUT/bench-cuda.md" --plot "$OUT/bench-cuda.png" 2>&1 | tee "$OUT/bench-cuda.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "gpu-check: results in $OUT (status $status)"
exit $status
