#!/usr/bin/env bash
# Create .venv (if needed) and install memlens editable with the given extra (e.g. "dev" or "notebook").
# torch==2.13.0 is installed first and explicitly so that pip never pulls a multi-GB CUDA build on a CPU
# machine; where .venv already has a torch (e.g. your own CUDA build) it is kept.
# Then the compiled recorder (memlens/recording/native) is built against that torch (once per machine,
# cached; MEMLENS_BUILD_DIR moves the cache). Without a C++ compiler this says so and memlens records
# with its Python recorder. Likewise the compiled snapshot-pickle walker (memlens/io/native, plain c++)
# and, on a CPU-only torch, the fake-CUDA shim of `memlens predict` (memlens/prediction/csrc).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRA=${1:?usage: scripts/install.sh EXTRA}
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[$EXTRA]"
# what is built next says so on stderr, with its progress (memlens/buildprogress.py); a cached build is quiet
echo "memlens: building the compiled parts against this torch (once per machine, cached; the compiled recorder" \
     "takes about 3 min on 2 cores)"
.venv/bin/python - <<'PYEOF' || true
from memlens.recording import native
try:
    native.load()
    print(f"memlens: compiled recorder ready ({native.build_dir()})")
except native.NativeUnavailable as exc:
    print(f"memlens: compiled recorder not built ({exc}); recording uses the Python recorder")
from memlens.io import native as io_native
try:
    io_native.load()
    print("memlens: compiled snapshot-pickle walker ready")
except io_native.NativeUnavailable as exc:
    print(f"memlens: compiled snapshot-pickle walker not built ({exc}); snapshots are read by the Python walker")
# the fake-CUDA shim of `memlens predict` on a CPU-only torch: built here, so that no first use compiles
from memlens.prediction import shim
try:
    if not shim.torch_has_cuda_build():
        print(f"memlens: fake-CUDA shim ready ({shim.build()})")
except Exception as exc:
    print(f"memlens: fake-CUDA shim not built ({str(exc).splitlines()[0] if str(exc) else exc}); "
          "memlens predict builds it on first use")
PYEOF
# the console script lives in .venv/bin, which is not on PATH until the venv is activated
echo "memlens is installed in .venv: run .venv/bin/memlens --help, or 'source .venv/bin/activate' first to type just memlens"
