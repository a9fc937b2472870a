# Sourced by tools/test.sh and tools/demo.sh: make (or reuse) ./.venv and install fastload into it.
# Usage: . tools/_venv.sh EXTRAS   (EXTRAS: "" or "test")
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first, pinned: an unpinned torch resolves to a multi-GB CUDA build on machines without a GPU.
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q "torch==${FASTLOAD_TORCH_VERSION:-2.13.0}"
spec="."
[ -n "${1:-}" ] && spec=".[$1]"
.venv/bin/pip install -q -e "$spec"
