#!/usr/bin/env bash
# Run HERE (a machine with the package registries), before a session's first call to the GPU
# machine: fetch what that machine lacks into ./.device/ (git-ignored), to be carried with the
# call (`carry: [".device/wheels", ".device/debs"]`, ~15 MiB): cp312 wheels of pyzmq and the test
# tools, and libjpeg-turbo's .debs (the GPU machine has no libjpeg headers to build native/).
# tools/device/checks.sh, run there, installs them. See tools/device/README.md.
#
#   bash tools/device/prepare.sh [--dali]
#
# --dali also fetches NVIDIA DALI for backend="dali" and cuts an xz tar of what it needs (~800 MB
# unpacked) into parts of at most 60 MiB under .device/dali-parts/, to carry one a call (README.md).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
py=${PYTHON:-python3}
dest=.device
mkdir -p "$dest/wheels" "$dest/debs"
grep -qxF ".device/" .gitignore || echo ".device/" >> .gitignore
# The GPU machine's python is 3.12 on x86_64 Linux; its torch, numpy, h5py, torchvision and
# scikit-image are there already, so only these (and their dependencies) travel.
"$py" -m pip download -q -d "$dest/wheels" --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform any \
    "pyzmq>=25" "pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100" "psutil>=5.9" "setuptools>=68" wheel
(cd "$dest/debs" && apt-get download libjpeg62-turbo libjpeg62-turbo-dev)
if [ "${1:-}" = "--dali" ]; then
    # DALI as an xz tar of its wheels' contents, this Python's ABI only: its extension modules for
    # other Pythons, its C++ headers and `nvidia/__init__.py` left out (without that file `nvidia`
    # stays a namespace package, so torch's nvidia.* libraries there stay importable). Only what
    # the pipelines import: DALI, nvImageCodec, nvJPEG, and DALI's pure-Python needs the GPU
    # machine lacks. checks.sh unpacks it onto PYTHONPATH.
    wheels=$(mktemp -d) site=$(mktemp -d)
    "$py" -m pip download -q -d "$wheels" --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform any "nvidia-dali-cuda120>=2.4"
    for name in nvidia_dali_cuda120 nvidia_nvimgcodec_cu12 nvidia_nvjpeg_cu12 optree makefun astunparse gast nvtx; do
        for wheel in "$wheels/$name"-*.whl; do "$py" -m zipfile -e "$wheel" "$site"; done
    done
    find "$site" -name '*.cpython-3*' ! -name '*cpython-312-*' -delete
    rm -rf "$site/nvidia/dali/include" "$site/nvidia/__init__.py"
    mkdir -p "$dest/dali-parts" && rm -f "$dest"/dali-parts/dali.tar.*
    tar -C "$site" -cf - . | xz -6 -T0 | split -b 60M -d -a 2 - "$dest/dali-parts/dali.tar.xz."
    rm -rf "$wheels" "$site"
fi
du -sh "$dest"/*
