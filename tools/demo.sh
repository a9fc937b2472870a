#!/usr/bin/env bash
# Install fastload into ./.venv, then run the demo on a small generated JPEG dataset.
. "$(dirname "${BASH_SOURCE[0]}")/_venv.sh" ""
exec .venv/bin/fastload demo "$@"
