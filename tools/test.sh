#!/usr/bin/env bash
# Install fastload with its test tools into ./.venv, then lint, type-check and run the whole suite.
# GPU tests (tests/gpu/) run when CUDA is available and are skipped, with the reason, otherwise.
# The `dali` extra (NVIDIA DALI, ~420 MB) is installed too: backend="dali" is tested on its CPU path;
# and the `hdf5` extra (h5py), for HDF5 sources.
. "$(dirname "${BASH_SOURCE[0]}")/_venv.sh" test,dali,hdf5,remote
.venv/bin/ruff check fastload tests tools examples
.venv/bin/mypy
# Two test processes: most tests wait on subprocesses, sockets and sleeps, so two share 2 cores well
# (a fresh clone's suite: 11 min in one, 7 in two, on a 2-vCPU VM). `-n 0` (or another -n) wins.
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 "$@"
