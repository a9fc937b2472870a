#!/usr/bin/env bash
# Build fastload._jpeg with AddressSanitizer and UndefinedBehaviorSanitizer into a temporary
# folder (the source tree and its in-place build are left alone) and run the native decoder's
# tests against that build: random boxes, filters and flips, truncations and byte corruptions.
#
# Usage: tools/native_sanitize.sh [PYTEST_ARGS...]    (default: tests/test_native_decode.py)
# PYTHON picks the interpreter (default .venv/bin/python, as tools/test.sh makes it); it needs
# pytest, numpy and Pillow, and gcc with libasan (`gcc -print-file-name=libasan.so`).
#
# - libasan is LD_PRELOADed: python itself is not instrumented, and ASan must be loaded first.
# - detect_leaks=0: CPython keeps objects alive until exit by design, so LeakSanitizer would
#   report them; the decoder's own error paths are checked for leaks by
#   test_error_paths_do_not_leak in the normal build, which is why that test is left out here
#   (ASan's quarantine keeps freed memory resident, so RSS grows whatever the code does).
# - halt_on_error=1 for UBSan, and ASan stops at its first report: any finding fails the run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python=${PYTHON:-.venv/bin/python}
libasan=$(gcc -print-file-name=libasan.so)
if [ ! -e "$libasan" ]; then
    echo "gcc has no libasan.so (Debian/Ubuntu: apt-get install libasan8, or gcc's own package)" >&2
    exit 2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The package's Python files and the sanitized extension, side by side in $tmp/lib. CFLAGS come
# after Python's own (which has -fwrapv), so -fno-wrapv lets UBSan check signed overflow too.
mkdir -p "$tmp/lib"
tar -c --exclude='*.so' --exclude=__pycache__ fastload | tar -x -C "$tmp/lib"
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
CFLAGS="$flags -fno-wrapv -g" LDFLAGS="-fsanitize=address,undefined" \
    "$python" setup.py -q build_ext --build-lib "$tmp/lib" --build-temp "$tmp/temp" --force

if [ $# -eq 0 ]; then
    set -- tests/test_native_decode.py -k "not test_error_paths_do_not_leak"
fi

export LD_PRELOAD=$libasan
export ASAN_OPTIONS=detect_leaks=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export PYTHONPATH=$tmp/lib
# -P: do not put the working directory first on sys.path, so `fastload` is the copy in $tmp/lib.
"$python" -P -c 'import fastload._jpeg as m, sys; sys.exit(0 if m.__file__.startswith(sys.argv[1]) else
    f"imported {m.__file__}, not the sanitized build")' "$tmp/lib"
echo "sanitized build: $tmp/lib/fastload ($(basename "$libasan") preloaded)"
# --capture=sys: a sanitizer writes its report to fd 2 and exits at once, so pytest must not be
# holding fd 2 in a capture file then.
"$python" -P -m pytest -q -p no:cacheprovider --capture=sys "$@"
