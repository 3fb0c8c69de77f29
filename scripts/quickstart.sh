#!/usr/bin/env bash
# Set up (a .venv with hljax, once) and run the tiny default on CPU:
#
#   scripts/quickstart.sh [--setup-only] [launch.train flags, e.g. --config.grpo.steps=4]
#
# A rerun skips the install and resumes the run from its latest checkpoint. See scripts/_venv.sh for
# HLJAX_VENV, PYTHON and HLJAX_DRY_RUN.
set -euo pipefail
. "$(dirname "$0")/_venv.sh"
cd "$HLJAX_ROOT"

setup_only=0
if [ "${1:-}" = "--setup-only" ]; then
  setup_only=1
  shift
fi

ensure_venv
install_repo ""
[ "$setup_only" = 1 ] && exit 0
run exec "$HLJAX_VENV/bin/python" -m launch.train --config configs/tiny.py "$@"
