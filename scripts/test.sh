#!/usr/bin/env bash
# Set up (a .venv with hljax and its test extras, once) and run the tests:
#
#   scripts/test.sh [pytest arguments, e.g. -m "not slow" or tests/test_grpo_math.py]
#
# Chromium (tests/test_html_report.py renders a report in it) is installed with apt-get when it is
# missing and this runs as root; otherwise one line says so and that test fails. sglang-jax gets its own
# venv (scripts/sglang_jax.sh setup: Python >= 3.12, ~3 min and 1.8 GB the first time) for
# tests/test_sglang_jax.py, which skip without it unless HLJAX_REQUIRE_SGLANG_JAX=1 (CI sets it). See scripts/_venv.sh
# for HLJAX_VENV, PYTHON and HLJAX_DRY_RUN.
set -euo pipefail
. "$(dirname "$0")/_venv.sh"
cd "$HLJAX_ROOT"

ensure_venv
install_repo "[dev]"
if ! command -v chromium >/dev/null 2>&1; then
  if can_apt; then
    apt_install chromium || say "could not install chromium with apt-get: tests/test_html_report.py will fail"
  else
    say "chromium is missing and cannot be installed here (needs root and apt-get): tests/test_html_report.py will fail"
  fi
fi
# sglang-jax in a venv of its own, for tests/test_sglang_jax.py (HLJAX_SGLANG_JAX=0: skip it and them).
if [ "${HLJAX_SGLANG_JAX:-1}" = 1 ]; then
  "$HLJAX_ROOT/scripts/sglang_jax.sh" setup \
    || say "no sglang-jax venv: tests/test_sglang_jax.py will be skipped (HLJAX_SGLANG_JAX=0 skips this step)"
fi
run exec "$HLJAX_VENV/bin/python" -m pytest "$@"
