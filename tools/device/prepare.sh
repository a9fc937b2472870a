#!/usr/bin/env bash
# Run HERE (a machine with the package registries), before a session's first call to the GPU
# machine: fetch what that machine lacks into ./.device/ (git-ignored), to be carried with the
# call (`carry: [".device/wheels", ".device/debs"]`, ~15 MiB): cp312 wheels of pyzmq and the test
# tools, and libjpeg-turbo's .debs (the GPU machine has no libjpeg headers to build native/).
# tools/device/checks.sh, run there, installs them. See tools/device/README.md.
#
#   bash tools/device/prepare.sh [--dali]
#
# --dali also fetches NVIDIA DALI's wheels for backend="dali" (~450 MB) and cuts them into
# parts of at most 60 MiB under .device/dali-parts/, to carry one a call (README.md).
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
    mkdir -p "$dest/dali" "$dest/dali-parts"
    "$py" -m pip download -q -d "$dest/dali" --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform any "nvidia-dali-cuda120>=1.30"
    rm -f "$dest"/dali/numpy-*.whl  # the GPU machine's numpy stays: pip keeps a satisfied dependency
    rm -f "$dest"/dali-parts/dali.tar.*
    (cd "$dest/dali" && tar -cf - ./*.whl) | split -b 60M -d -a 2 - "$dest/dali-parts/dali.tar."
    rm -rf "$dest/dali"
fi
du -sh "$dest"/*
