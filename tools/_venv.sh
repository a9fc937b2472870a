# Sourced by tools/test.sh and tools/demo.sh: make (or reuse) ./.venv and install fastload into it.
# Usage: . tools/_venv.sh EXTRAS   (EXTRAS: "", or a comma list of extras: "test", "test,dali")
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip -q)
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first, pinned: an unpinned torch resolves to a multi-GB CUDA build on machines without a GPU.
.venv/bin/python -c "import torch" 2>/dev/null || "${pip[@]}" install "torch==${FASTLOAD_TORCH_VERSION:-2.13.0}"
# PIL for the non-JPEG paths and the demo: pillow-simd built with AVX2 where the CPU has it and the
# build succeeds, Pillow otherwise. It is not a package dependency, so no later install swaps it.
if ! .venv/bin/python -c "import PIL" 2>/dev/null; then
    if grep -qw avx2 /proc/cpuinfo 2>/dev/null \
        && CC="cc -mavx2" "${pip[@]}" install --no-binary pillow-simd "pillow-simd>=9.1"; then
        echo "installed pillow-simd (AVX2)"
    else
        "${pip[@]}" install "pillow>=9.1"
    fi
fi
# torchvision: the transform tests' reference, test-only. Each release requires exactly one torch
# (torchvision 0.N+15 for torch 2.N), so it goes in without dependencies, pulling neither another
# torch nor Pillow over pillow-simd; where none matches, its tests skip and say why.
if [[ ",${1:-}," == *,test,* ]] && ! .venv/bin/python -m pip show -q torchvision >/dev/null 2>&1; then
    torch_minor=$(.venv/bin/python -c "import torch; print(torch.__version__.split('.')[1])")
    "${pip[@]}" install --no-deps "torchvision==0.$((torch_minor + 15)).*" \
        || echo "no torchvision for this torch: the tests that compare against it will skip"
fi
spec="."
[ -n "${1:-}" ] && spec=".[$1]"
"${pip[@]}" install -e "$spec"
