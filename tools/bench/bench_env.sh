#!/usr/bin/env bash
# Make (or reuse) the throwaway venvs that the loader benchmark's peer systems run in
# (tools/bench/bench_loaders.py). They live outside the repo, in $BENCH_VENVS (required; the benchmark
# tools find them there too), and are never dependencies of fastload. A venv that already imports
# what it needs is kept.
#
# Usage: BENCH_VENVS=DIR tools/bench/bench_env.sh
#
# What worked (Debian 12, Python 3.11.7, pip 26.3 in the venvs, no GPU):
# - tv: `pip install torch==2.14.1 torchvision==0.29.1` takes both from this machine's local
#   wheels (a CUDA build, ~5.7 GB venv; it runs on the CPU). scikit-image supplies the real
#   photos that tools/bench/make_bench_dataset.py derives the benchmark images from.
# - ffcv: after `apt-get install -y libturbojpeg0-dev libopencv-dev pkg-config`, `pkg-config`
#   finds opencv4 (4.6.0) and libturbojpeg (2.1.5), the two names ffcv's setup.py asks for, and
#   a plain `pip install torch==2.13.0 numpy ffcv pillow` built ffcv 1.0.2 from its sdist with
#   build isolation: no patch, no --no-build-isolation, no cupy (CPU only). It pulled numba
#   0.68.1, llvmlite 0.50.0, opencv-python 5.0.0.93 and numpy 2.4.6, on which ffcv's CPU
#   Loader runs. Those versions are pinned below so that the peers stay comparable over time.
# - dali: `pip install nvidia-dali-cuda120 numpy pillow` gave DALI 2.4.0 (with nvidia-nvimgcodec-cu12
#   0.9.0.20); its CPU-only pipelines (device_id=None) run here without a GPU or CUDA driver.
# - simd: `CC="cc -mavx2" pip install --no-binary pillow-simd pillow-simd` built pillow-simd
#   12.1.1.post0 from its sdist in about a minute against Debian's libjpeg62-turbo-dev (2.1.5) and
#   zlib1g-dev (--no-cache-dir: a cached wheel built without -mavx2 would otherwise be reused).
set -euo pipefail

if [ -z "${BENCH_VENVS:-}" ]; then
    echo "usage: BENCH_VENVS=DIR $0   (DIR: where to make the peer venvs, outside the repo)" >&2
    exit 2
fi
venvs=$BENCH_VENVS
python=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1

# make_venv NAME CHECK_CODE PIP_ARGS...: keep $venvs/NAME if its python runs CHECK_CODE, else
# build it afresh with `pip install PIP_ARGS...`.
make_venv() {
    local name=$1 check=$2
    shift 2
    local dir="$venvs/$name"
    if [ -x "$dir/bin/python" ] && (cd / && "$dir/bin/python" -c "$check") 2>/dev/null; then
        echo "$dir: ok, kept"
        return
    fi
    echo "$dir: (re)creating"
    rm -rf "$dir"
    "$python" -m venv "$dir"
    "$dir/bin/pip" install -q --upgrade pip
    "$dir/bin/pip" install -q "$@"
    (cd / && "$dir/bin/python" -c "$check")
    echo "$dir: ready"
}

mkdir -p "$venvs"

make_venv tv "import torch, torchvision, skimage.data, PIL, numpy, psutil" \
    torch==2.14.1 torchvision==0.29.1 pillow==13.0.0 numpy==2.4.6 psutil==7.2.2 \
    scikit-image==0.26.0

if ! pkg-config --exists opencv4 libturbojpeg 2>/dev/null; then
    apt-get update
    apt-get install -y libturbojpeg0-dev libopencv-dev pkg-config
fi
make_venv ffcv "import torch, ffcv.loader, ffcv.writer" \
    torch==2.13.0 numpy==2.4.6 ffcv==1.0.2 pillow==13.0.0 numba==0.68.1 llvmlite==0.50.0 \
    opencv-python==5.0.0.93

# dali: NVIDIA DALI's CPU-only pipelines (device_id=None) need no GPU; the CUDA 12 wheel installs
# and runs its CPU operators on this machine.
make_venv dali "import nvidia.dali, nvidia.dali.fn, numpy, PIL" \
    nvidia-dali-cuda120==2.4.0 numpy==2.4.6 pillow==13.0.0

# simd: pillow-simd built from source with AVX2 against the system libjpeg-turbo and zlib.
if [ ! -e /usr/include/jpeglib.h ] || [ ! -e /usr/include/zlib.h ]; then
    apt-get update
    apt-get install -y libjpeg62-turbo-dev zlib1g-dev
fi
CC="cc -mavx2" make_venv simd \
    "import PIL, numpy; from PIL import Image; assert '.post' in PIL.__version__, PIL.__version__" \
    --no-cache-dir --no-binary pillow-simd pillow-simd==12.1.1.post0 numpy==2.4.6
