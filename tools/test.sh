#!/usr/bin/env bash
# Install fastload with its test tools into ./.venv, then lint, type-check and run the whole suite.
# GPU tests (tests/gpu/) run when CUDA is available and are skipped, with the reason, otherwise.
# The `dali` extra (NVIDIA DALI, ~420 MB) is installed too: backend="dali" is tested on its CPU path;
# and the `hdf5` extra (h5py), for HDF5 sources.
. "$(dirname "${BASH_SOURCE[0]}")/_venv.sh" test,dali,hdf5,remote
.venv/bin/ruff check fastload tests tools examples
# NOTE [mypy's cache beside pip's]: a fresh clone's mypy spends ~20 s of CPU on what no commit
# changed (torch's stubs, numpy's, the package's own unchanged modules); its cache in the user's
# cache directory, as pip's is, is shared by every clone. Sound to share: mypy re-checks any module
# whose source hash (or its version, or these options) differs from the cached one, and writes its
# entries atomically. MYPY_CACHE_DIR set in the environment wins; with no home, the clone's own.
cache_home=${XDG_CACHE_HOME:-${HOME:+$HOME/.cache}}
[ -z "$cache_home" ] || export MYPY_CACHE_DIR="${MYPY_CACHE_DIR:-$cache_home/fastload/mypy}"
.venv/bin/mypy
# NOTE [bytecode for the suite]: a machine that sets PYTHONDONTWRITEBYTECODE (a container image's
# habit) makes every test process compile what it imports from source, each time: the tests
# themselves, after pytest's assertion rewrite (13 of the 23 s each xdist worker spends collecting),
# and fastload's own modules (editable, so pip compiled none of them) in each of the hundreds of
# daemons, CLIs and spawned workers the suite starts (~0.5 s of CPU each). The suite writes them
# once, under the clone's gitignored __pycache__/ folders; Python's writes are atomic, so concurrent
# workers are safe. Measured here: a worker's collection 23.6 s -> 10.5 s; the whole suite's wall
# time moved less than its run-to-run noise (660 s, 647 s).
unset PYTHONDONTWRITEBYTECODE
# Three test processes on 2 cores: the tests wait on subprocesses, sockets and sleeps much of
# the time (-n 2 kept 2 cores ~70% busy: 483 s of CPU in 345 s), so a third fills the waits: the
# same 1,984 tests took 291 s with -n 3 against 345 s with -n 2, back to back on a quiet 2-vCPU VM,
# the same CPU; 11 min in one. Tests hold beside two CPU burners, a heavier load than a third
# process. `-n 0` (or another -n) wins.
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n 3 "$@"
