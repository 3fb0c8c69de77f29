#!/usr/bin/env bash
# sglang-jax (the JAX SGLang) on CPU, in a venv of its own: its pins (flax 0.12.4, transformers 4.57,
# Python >= 3.12) conflict with hljax's, so hljax talks to it over HTTP only.
#
#   scripts/sglang_jax.sh setup                      make the venv (once; ~3 min, 1.8 GB)
#   scripts/sglang_jax.sh serve EXPORT [--port P] [launch_server flags...]
#                                                    serve an hljax export (launch.export's folder)
#
#   HLJAX_SGLANG_JAX_VENV  the venv folder (default: .venv-sglang-jax in the repository)
#   PYTHON312              a Python >= 3.12 to create it (default: python3.12 on PATH, else pyenv's)
#
# The model is served through a view of its folder with the config keys sglang-jax's transformers (4.57)
# reads (hljax/generate/sglang_jax.py `served_view`); its head_dim must be a multiple of 128.
set -euo pipefail
. "$(dirname "$0")/_venv.sh"
cd "$HLJAX_ROOT"

SGLANG_JAX_PIN="sglang-jax[cpu]==0.1.0rc0"
VENV="${HLJAX_SGLANG_JAX_VENV:-$HLJAX_ROOT/.venv-sglang-jax}"

# A Python >= 3.12 that runs (a pyenv shim for a version not selected is on PATH but fails).
find_python312() {
  local candidate v
  local -a candidates=("${PYTHON312:-}" python3.12)
  if command -v pyenv >/dev/null 2>&1; then
    for v in $(pyenv versions --bare 2>/dev/null | grep -E '^3\.1[2-9]' | sort -V); do  # The oldest first: 3.12 is what sglang-jax documents.
      candidates+=("$(pyenv root)/versions/$v/bin/python")
    done
  fi
  candidates+=(python3.13 python3)
  for candidate in "${candidates[@]}"; do
    [ -n "$candidate" ] || continue
    "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1 && { echo "$candidate"; return 0; }
  done
  return 1
}

setup() {
  local stamp="$VENV/.sglang-jax-installed"
  [ -f "$stamp" ] && grep -qxF "$SGLANG_JAX_PIN" "$stamp" && return 0
  local py
  py="$(find_python312)" || die "sglang-jax needs Python 3.12 or newer and none was found (set PYTHON312=/path/to/python3.12, or: pyenv install 3.12)"
  say "installing $SGLANG_JAX_PIN into $VENV with $py (~3 min the first time)"
  [ -x "$VENV/bin/python" ] || run "$py" -m venv "$VENV" || die "could not create $VENV with $py -m venv"
  run "$VENV/bin/python" -m pip install -qq "$SGLANG_JAX_PIN" || die "pip install '$SGLANG_JAX_PIN' failed (see above)"
  [ "${HLJAX_DRY_RUN:-0}" = 1 ] || echo "$SGLANG_JAX_PIN" >"$stamp"
}

serve() {
  [ $# -ge 1 ] || die "usage: scripts/sglang_jax.sh serve EXPORT [--port P] [launch_server flags...]"
  local model="$1"; shift
  [ -f "$model/config.json" ] || die "$model has no config.json: pass a launch.export folder"
  [ -x "$HLJAX_VENV/bin/python" ] || die "no hljax venv at $HLJAX_VENV (it rewrites the folder's config for sglang-jax): run scripts/quickstart.sh or scripts/test.sh first"
  setup
  # A view of the folder with the config keys sglang-jax's transformers 4.57 reads (the folder is unchanged).
  local view
  view="$("$HLJAX_VENV/bin/python" -m hljax.generate.sglang_jax view "$model")" || exit 1
  # Small KV pool: sglang-jax's native attention reads the whole pool every step on CPU. No radix cache
  # and no warm-up: log-probs with a prefix-cache hit, or a batch that mixes requests with and without
  # them, crash its scheduler (see SERVE_FLAGS in hljax/generate/sglang_jax.py, the one list of the flags).
  local flags
  flags="$("$HLJAX_VENV/bin/python" -m hljax.generate.sglang_jax flags)" || exit 1
  # shellcheck disable=SC2086 # $flags is a list of plain words (REQUIRED_FLAGS in hljax/generate/sglang_jax.py).
  JAX_PLATFORMS=cpu run exec "$VENV/bin/python" -m sgl_jax.launch_server --model-path "$view" --device cpu \
    --dtype float32 --context-length 1024 --max-total-tokens 4096 --max-running-requests 8 $flags "$@"
}

case "${1:-}" in
  setup) setup ;;
  serve) shift; serve "$@" ;;
  *) die "usage: scripts/sglang_jax.sh setup | serve EXPORT [--port P] [launch_server flags...]" ;;
esac
