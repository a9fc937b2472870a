#!/usr/bin/env bash
# Run ON THE GPU MACHINE, from the repository root, with .device/ carried (tools/device/prepare.sh
# fills it here first). Installs the carried wheels, builds the native decoder against the
# carried libjpeg-turbo, refuses to go on if `fastload._jpeg` does not import (the Pillow fallback
# would make every figure silently wrong), then runs what is asked, writing to $OUT:
#
#   bash tools/device/checks.sh suite   # the whole test suite (tests/gpu included) -> $OUT/suite.txt
#   bash tools/device/checks.sh train   # issue 11's training benchmarks -> $OUT/train.txt
#   bash tools/device/checks.sh gpu     # issue 21's GPU-decoding table (bench_gpu_decode.py: native,
#                                       #   nvjpeg, DALI's shapes if DALI is installed, native on a
#                                       #   pack at --max-side 320; ResNet-18 fed) and tests/gpu
#                                       #   -> $OUT/gpu.txt, ~4 minutes with the dataset
#   bash tools/device/checks.sh dali    # backend="dali" (mixed) benchmarks, DALI unpacked first
#                                       #   from /tmp/dali-parts (README.md) -> $OUT/dali.txt
#
# Several may be named in one call (`suite train`). Every step is bounded by `timeout`.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
out=${OUT:-/tmp/fastload-out}
mkdir -p "$out"
py=${PYTHON:-python3}
install=("$py" -m pip install -q)
"$py" -m pip install --help | grep -q -- --break-system-packages && install+=(--break-system-packages)
pip=("${install[@]}" --no-deps)
log() { echo "[$(date +%T)] $*" | tee -a "$out/checks.log"; }

setup() {
    log "install carried wheels"
    "${install[@]}" --no-index --find-links .device/wheels pyzmq pytest pytest-timeout hypothesis psutil \
        setuptools wheel >>"$out/checks.log" 2>&1 || { log "wheel install failed"; return 1; }
    log "build native/ against the carried libjpeg-turbo"
    rm -rf /tmp/jpeg && mkdir -p /tmp/jpeg
    for deb in .device/debs/*.deb; do dpkg -x "$deb" /tmp/jpeg; done
    local lib=/tmp/jpeg/usr/lib/x86_64-linux-gnu
    export CFLAGS="-I/tmp/jpeg/usr/include -I/tmp/jpeg/usr/include/x86_64-linux-gnu"
    export LDFLAGS="-L$lib -Wl,-rpath,$lib"
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    rm -f fastload/_jpeg*.so
    "${pip[@]}" --no-index --no-build-isolation -e . >>"$out/checks.log" 2>&1 || { log "build failed"; return 1; }
    "$py" -c "import fastload._jpeg, torch; print('native decoder OK; torch', torch.__version__, 'cuda', \
torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" \
        >>"$out/checks.log" 2>&1 || { log "fastload._jpeg does not import: no figures"; return 1; }
    tail -1 "$out/checks.log"
    nproc | sed 's/^/cores: /' | tee -a "$out/checks.log"
}

dataset() {  # 10,000 photo-like JPEGs of ImageNet sizes, 100 classes, made once per machine
    data=/tmp/bench-data
    [ -d "$data" ] && return 0
    log "make the benchmark dataset"
    rm -rf "$data.partial"  # a dataset cut short by the timeout is never used
    timeout 300 "$py" tools/bench/make_bench_dataset.py "$data.partial" --images 10000 --classes 100 \
        >>"$out/checks.log" 2>&1 && mv "$data.partial" "$data"
}

suite() {
    log "whole suite"
    local parallel=()  # pytest-xdist where the machine has it (pytest-benchmark off: it refuses xdist)
    "$py" -c "import xdist" 2>/dev/null && parallel=(-n 12 -p no:benchmark)
    timeout "${SUITE_TIMEOUT:-500}" "$py" -m pytest -q -p no:cacheprovider --timeout 300 "${parallel[@]}" >"$out/suite.txt" 2>&1
    log "suite exit $?: $(tail -1 "$out/suite.txt")"
}

gpu() {  # issue 21: which GPU decoder, which shape; one table (bench_gpu_decode.py's docstring)
    dataset || { log "no dataset"; return 1; }
    local pack=/tmp/bench-pack320 variants=${GPU_VARIANTS:-native,nvjpeg[threads=4]}
    if [ ! -f "$pack/manifest.json" ]; then
        log "pack the dataset at --max-side 320"
        rm -rf "$pack"
        timeout 120 "$py" -m fastload pack "$data" "$pack" --max-side 320 --quiet >>"$out/checks.log" 2>&1 \
            || { log "pack failed"; rm -rf "$pack"; }
    fi
    [ -f "$pack/manifest.json" ] && variants+=",native@$pack" && du -sh "$data" "$pack" | tee -a "$out/checks.log"
    use_dali && variants+=",$(PYTHONPATH="tools/bench:${PYTHONPATH:-}" "$py" -c \
        'import bench_gpu_decode as b; print(",".join(v for v in b.split_variants(b.DEFAULT_VARIANTS) if v.startswith("dali")))')"
    [ -n "${DALI_VARIANTS:-}" ] && variants=${variants%%,dali*},${DALI_VARIANTS//@pack/@$pack}
    local round
    for round in $(seq "${GPU_ROUNDS:-1}"); do  # rounds for medians: each a whole table, alternating
        log "bench_gpu_decode round $round: $variants"
        timeout "${BENCH_TIMEOUT:-360}" "$py" tools/bench/bench_gpu_decode.py --data "$data" --workers 15 \
            --batch-size 256 --batches 60 --warmup 10 --model resnet18 --variants "$variants" \
            --json "$out/gpu.jsonl" 2>&1 | grep -v -e nvjpeg2k -e nvJPEG2000 -e nvtiff -e nvTIFF >>"$out/gpu.txt"
        log "bench_gpu_decode exit ${PIPESTATUS[0]}"
    done
    [ "${GPU_TESTS:-1}" = 0 ] && return 0
    timeout 150 "$py" -m pytest -q -p no:cacheprovider -p no:benchmark tests/gpu >>"$out/gpu.txt" 2>&1
    log "tests/gpu exit $?: $(tail -1 "$out/gpu.txt")"
}

train() {  # ~4 minutes on 16 cores: issue 11's figures (its targets: 97% / 97% / 95%)
    dataset || { log "no dataset"; return 1; }
    local common=(--data "$data" --workers 15 --batch-size 256 --epochs 3 --warmup 10)
    log "bench_train: a simulated 64 ms step (could take 4,000 img/s)"
    timeout 150 "$py" tools/bench/bench_train.py "${common[@]}" --step sleep:64 --rounds 2 >>"$out/train.txt" 2>&1
    log "bench_train: ResNet-50 (AMP bf16), fastload and DataLoader + torchvision"
    timeout 240 "$py" tools/bench/bench_train.py "${common[@]}" --step resnet50 --rounds 1 \
        --loaders fastload,dataloader >>"$out/train.txt" 2>&1
    log "bench_train: ResNet-18"
    timeout 120 "$py" tools/bench/bench_train.py "${common[@]}" --step resnet18 --rounds 1 >>"$out/train.txt" 2>&1
    log "train exit $?"
}

use_dali() {  # DALI from the carried parts (prepare.sh --dali), unpacked onto PYTHONPATH once
    "$py" -c "import nvidia.dali" 2>/dev/null && return 0
    ls /tmp/dali-parts/dali.tar.xz.* >/dev/null 2>&1 || return 1
    if [ ! -d /tmp/dali-site/nvidia/dali ]; then
        log "unpack DALI from $(ls /tmp/dali-parts | wc -l) parts"
        rm -rf /tmp/dali-site.partial && mkdir -p /tmp/dali-site.partial
        cat /tmp/dali-parts/dali.tar.xz.* | "$py" -c \
            'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)' \
            | tar -xf - -C /tmp/dali-site.partial \
            && mv /tmp/dali-site.partial /tmp/dali-site || { log "DALI unpack failed"; return 1; }
    fi
    export PYTHONPATH="/tmp/dali-site${PYTHONPATH:+:$PYTHONPATH}"
    "$py" -c "import nvidia.dali as d; print('DALI', d.__version__)" >>"$out/checks.log" 2>&1 \
        || { log "DALI does not import"; return 1; }
}

dali() {
    use_dali || { log "no DALI: carry its parts first (README.md)"; return 1; }
    dataset || return 1
    log "bench_train backend=dali (mixed) vs native"
    timeout 400 "$py" tools/bench/bench_train.py --data "$data" --workers 15 --batch-size 256 --epochs 3 \
        --warmup 10 --rounds 2 --step resnet18 --loaders fastload,fastload-dali >>"$out/dali.txt" 2>&1
    timeout 300 "$py" -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_dali.py >>"$out/dali.txt" 2>&1
    log "dali exit $?"
}

for what in "$@"; do
    case "$what" in suite | train | dali | gpu) ;; *) echo "unknown step $what: suite, train, dali or gpu" >&2; exit 2 ;; esac
done
setup || exit 1
for what in "$@"; do "$what"; done
log "done"
