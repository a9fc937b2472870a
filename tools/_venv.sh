# Sourced by tools/test.sh and tools/demo.sh: make (or reuse) ./.venv and install fastload into it.
# Usage: . tools/_venv.sh EXTRAS   (EXTRAS: "", or a comma list of extras: "test", "test,dali")
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
# NOTE [bytecode after the installs]: pip compiles every file it installs, one file at a time: ~90 s
# of CPU for torch, DALI, Ray and the rest, a third of a fresh install on 2 cores. So the big
# installs below pass --no-compile, and `compileall -j 0` at the end does the same work on every
# core (50 s on 2 cores), skipping on a rerun what is compiled already.
pip=(.venv/bin/python -m pip -q)
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first, pinned: an unpinned torch resolves to a multi-GB CUDA build on machines without a GPU.
.venv/bin/python -c "import torch" 2>/dev/null || "${pip[@]}" install --no-compile "torch==${FASTLOAD_TORCH_VERSION:-2.13.0}"
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
importable() { .venv/bin/python -c "import $1" >/dev/null 2>&1; }
# What `pip show NAME` says (installed, by distribution name), without starting pip (~1 s each).
installed() {
    .venv/bin/python -c "import importlib.metadata as m, sys; m.distribution(sys.argv[1])" "$1" >/dev/null 2>&1
}
extras=${1:-}
requirements=()  # installed with fastload, in one resolution
without_deps=()  # installed last, without their dependencies: they require Pillow
if [[ ",$extras," == *,test,* ]]; then
    # NOTE [test references outside the venv]: torchvision (the transforms' reference) and timm (its
    # recipes') go in without dependencies: they would pull Pillow over pillow-simd, and torchvision
    # another torch. Each torchvision release matches exactly one torch (0.N+15 for 2.N). A CPU
    # torch (+cpu) needs torchvision's CPU build, which only PyTorch's CPU index has; the registry
    # has CUDA builds, which over a CPU torch cannot load their compiled operators and raise at
    # import, and installed in the venv would break `import lightning` and `import timm` with them.
    # So where the CPU build cannot be had (that index unreachable), the registry's build goes into
    # .venv/test-reference, off the venv's path, with timm: tests/helpers.py `torchvision_or_skip()`
    # puts it on the tests' path, stubbing its operators' meta registrations (the transforms are
    # plain torch code); the venv's own users (Lightning, the examples) find no torchvision rather
    # than a broken one. Not done: building torchvision from source (longer than the whole suite),
    # a CUDA torch (gigabytes), patching torchvision in the venv.
    ref=.venv/test-reference
    torchvision_ok=false
    if installed torchvision; then
        if importable torchvision; then
            torchvision_ok=true
        else
            echo "removing a torchvision that does not import (built for another torch)"
            "${pip[@]}" uninstall -y torchvision
        fi
    fi
    if ! $torchvision_ok && [ ! -d "$ref/torchvision" ]; then
        torch_version=$(.venv/bin/python -c "import torch; print(torch.__version__)" 2>/dev/null)
        torchvision="torchvision==0.$(($(echo "$torch_version" | cut -d. -f2) + 15)).*"
        if [[ $torch_version == *+cpu ]]; then
            # The CPU index alone (pip's configured find-links and indexes would offer the CUDA
            # build under the same version), and briefly; FASTLOAD_TORCH_CPU_INDEX names a mirror.
            if env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL -u PIP_CONSTRAINT \
                PIP_CONFIG_FILE=/dev/null "${pip[@]}" install --no-deps --timeout 10 --retries 0 \
                --index-url "${FASTLOAD_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" \
                "$torchvision" 2>/dev/null; then
                torchvision_ok=true
                echo "installed torchvision's CPU build"
            fi
        elif "${pip[@]}" install --no-deps "$torchvision"; then
            if importable torchvision; then
                torchvision_ok=true
            else
                "${pip[@]}" uninstall -y torchvision
            fi
        fi
        if $torchvision_ok; then
            :
        elif "${pip[@]}" install --no-deps --target "$ref" "$torchvision"; then
            echo "torchvision: no build for torch $torch_version here; the nearest is in $ref, for the tests"
        else
            echo "no torchvision for this torch: the tests that compare against it will skip"
        fi
    fi
    # timm goes where torchvision is; what it needs at import besides them (none of it Pillow):
    if ! $torchvision_ok && installed timm; then
        "${pip[@]}" uninstall -y timm  # it imports torchvision: it goes beside the reference
    fi
    if ! installed timm && [ ! -d "$ref/timm" ]; then
        requirements+=(huggingface_hub safetensors pyyaml)
        if $torchvision_ok; then
            without_deps+=("timm==1.0.*")
        else
            "${pip[@]}" install --no-deps --target "$ref" "timm==1.0.*" \
                || echo "no timm: the tests that compare against it will skip"
        fi
    fi
    # tensorboard (examples/tensorboard_scalars.py, run by the tests, and their reader of its event
    # file) requires `pillow` too; what it needs besides, none of it Pillow:
    if ! installed tensorboard; then
        requirements+=(absl-py "grpcio>=1.74" markdown "protobuf>=6.31.1,<8" "tensorboard-data-server>=0.7,<0.8"
            werkzeug packaging setuptools)
        without_deps+=("tensorboard>=2.16")
    fi
    # matplotlib (`fastload iostat --plot`) requires `pillow`, a name pillow-simd does not provide.
    if ! installed matplotlib; then
        requirements+=(contourpy cycler fonttools kiwisolver numpy packaging pyparsing python-dateutil)
        without_deps+=("matplotlib>=3.7")
    fi
fi
spec="."
[ -n "$extras" ] && spec=".[$extras]"
"${pip[@]}" install --no-compile -e "$spec" "${requirements[@]}"
[ ${#without_deps[@]} -eq 0 ] || "${pip[@]}" install --no-compile --no-deps "${without_deps[@]}"
# Pillow beside pillow-simd (a dependency's, or in a .venv made before the above): both write the
# PIL package, whichever came last wins, and uninstalling one breaks the other; so Pillow goes and
# pillow-simd is put back whole (from pip's wheel cache when it has the build).
if installed pillow-simd && installed pillow; then
    echo "removing Pillow, installed over pillow-simd; reinstalling pillow-simd"
    simd=$(.venv/bin/python -c "from importlib.metadata import version; print(version('pillow-simd'))")
    "${pip[@]}" uninstall -y pillow
    CC="cc -mavx2" "${pip[@]}" install --force-reinstall --no-deps --no-binary pillow-simd "pillow-simd==$simd"
fi
# The bytecode pip did not write (NOTE [bytecode after the installs]), once per set of installed
# distributions: a rerun that installed nothing new skips the 11 s compileall takes to find that out.
# A file written for another Python (some packages ship such templates) fails to compile here as it
# did under pip: not an error. (.venv/test-reference is installed without --no-compile.)
installed_set=$(.venv/bin/python -c "import importlib.metadata as m
print(sorted(f'{d.metadata[\"Name\"]}=={d.version}' for d in m.distributions()))" | sha256sum)
if [ "$(cat .venv/.bytecode-for 2>/dev/null)" != "$installed_set" ]; then
    .venv/bin/python -m compileall -q -j 0 .venv/lib >/dev/null 2>&1 || true
    echo "$installed_set" > .venv/.bytecode-for
fi
