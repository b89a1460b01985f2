#!/usr/bin/env bash
# The package as a user gets it: build the wheel and the sdist, install the wheel (not
# editable) into a fresh virtualenv, and run the demo and a compile + run from a directory
# outside the repository, so nothing can lean on the working tree. Also checks that no
# top-level `passes` module was installed beside gradcompiler.
#
#   scripts/check_wheel.sh [PYTHON]     (default: .venv/bin/python, which needs `build`)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
BASE_PYTHON=${BASE_PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$PY" -m build --wheel --sdist --outdir "$work/dist" . >"$work/build.log" 2>&1 \
    || { cat "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/gradcompiler-*.whl)
sdist=$(ls "$work"/dist/gradcompiler-*.tar.gz)
echo "wheel-check: built $(basename "$wheel") and $(basename "$sdist")"
"$PY" - "$wheel" <<'EOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
tops = sorted({n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")})
assert tops == ["gradcompiler"], f"the wheel installs {tops}, not only gradcompiler"
assert "gradcompiler/passes/fuse.py" in names and "gradcompiler/py.typed" in names
EOF

"$BASE_PYTHON" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip
"$work/venv/bin/python" -m pip install -q "$wheel[viz]"  # the demo writes a DOT dump
echo "wheel-check: installed the wheel into a fresh virtualenv"

outside="$work/outside"
mkdir -p "$outside"
cp examples/*.py "$outside/"
cd "$outside"
export GRADCOMPILER_CACHE_DIR="$work/kernel-cache"
if "$work/venv/bin/python" -c "import passes" 2>/dev/null; then
    echo "wheel-check: 'import passes' works in the fresh virtualenv; it must not" >&2; exit 1
fi
echo "wheel-check: 'import passes' fails in the fresh virtualenv, as it must"
"$work/venv/bin/python" - <<'EOF'
import numpy as np
import gradcompiler as gc
import gradcompiler.passes.pipeline

assert "site-packages" in gc.__file__ and "site-packages" in gradcompiler.passes.pipeline.__file__
with gc.Graph("outside"):
    x = gc.input("x", (4, 3))
    w = gc.param("w", (3, 2))
    loss = (gc.tanh(x @ w) ** 2).sum()
grad_w, = gc.grad(loss, [w])
rng = np.random.default_rng(0)
feeds = {"x": rng.standard_normal((4, 3)).astype("float32"),
         "w": rng.standard_normal((3, 2)).astype("float32")}
got = gc.compile([loss, grad_w], target="cpu")(**feeds)
expected = gc.evaluate([loss, grad_w], feeds)
for g, e in zip(got, expected):
    np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
print(f"wheel-check: gradcompiler {gc.__version__} from {gc.__file__}: compile + run matches "
      "the reference")
EOF
"$work/venv/bin/python" demo.py --steps 3 --dot "$outside/step.dot"
"$work/venv/bin/gradcompiler" cache info
echo "wheel-check: passed"
