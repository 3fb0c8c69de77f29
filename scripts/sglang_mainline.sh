#!/usr/bin/env bash
# Mainline SGLang on CPU, in a venv of its own, for the opt-in weight-push test tier
# (tests/test_sglang_mainline.py). Off SGLang's documented path: its CPU docs build sgl-kernel from
# source, and no CPU wheel exists. Here: the local CPU torch 2.13.0, the sglang wheel with --no-deps, the
# pure-Python dependencies it needs to import and serve (pinned below, found by trying), the real triton
# (imported at module level everywhere; its @triton.jit works without a GPU), and two TEST-ONLY
# stand-ins for `sgl_kernel` and `torchvision` (tests/sglang_stubs/: importable, never callable; the
# torch_native CPU path does not call them). Never use this venv for real serving.
#
#   scripts/sglang_mainline.sh setup                      make the venv (once; ~3 min, 2.5 GB)
#   scripts/sglang_mainline.sh serve EXPORT [--port P] [launch_server flags...]
#                                                         serve an hljax export (hf.save_hf's folder)
#
#   HLJAX_SGLANG_MAINLINE_VENV  the venv folder (default: .venv-sglang-mainline in the repository)
#   PYTHON                      the interpreter that creates it (default: python3; 3.11 exactly: the
#                               local CPU torch wheel is cp311, and sglang 0.5.23 needs >= 3.11)
set -euo pipefail
. "$(dirname "$0")/_venv.sh"
cd "$HLJAX_ROOT"

SGLANG_PIN="sglang==0.5.23"
TORCH_PIN="torch==2.13.0"  # The CPU build on local disk (pip's find-links), as setup.py's [dev] extra.
# What sglang 0.5.23 needs to import and serve a text model on CPU; its own pins where it has them.
# prometheus-client, flashinfer, sgl-kernel, the CUDA packages and the multimodal stack are left out.
DEPS=(
  "transformers==5.19.0" "tokenizers==0.23.2" "sentencepiece==0.2.1" "numpy==2.4.6" "safetensors==0.8.0"
  "triton==3.9.0" "apache-tvm-ffi==0.1.11" "xgrammar==0.2.7" "compressed-tensors==0.18.0" "openai==2.8.0"
  "soundfile==0.13.1" "fastapi==0.165.0" "uvicorn==0.55.0" "uvloop==0.23.0" "python-multipart==0.0.34"
  "pydantic==2.14.4" "orjson==3.13.0" "msgspec==0.23.0" "pyzmq==27.3.0" "psutil==7.2.2" "requests==2.34.2"
  "aiohttp==3.14.5" "setproctitle==1.3.8" "pybase64==1.5.1" "einops==0.8.2" "packaging==26.4"
  "tqdm==4.70.1" "regex==2026.12.2" "pillow==13.0.0" "ipython==9.19.1" "dill==0.4.1" "gguf==0.19.0"
  "partial-json-parser==0.2.1.1.post7" "jsonschema==4.26.0"
)
STUBS="$HLJAX_ROOT/tests/sglang_stubs"
VENV="${HLJAX_SGLANG_MAINLINE_VENV:-$HLJAX_ROOT/.venv-sglang-mainline}"

# What the venv was made from: the pins and the stand-ins' contents (an edited stand-in is re-copied).
stamp_key() {
  { echo "$SGLANG_PIN $TORCH_PIN ${DEPS[*]}"; cat "$STUBS"/*/__init__.py; } | sha256sum | cut -d' ' -f1
}

setup() {
  local stamp="$VENV/.sglang-mainline-installed" key
  key="$(stamp_key)"
  [ -f "$stamp" ] && grep -qxF "$key" "$stamp" && return 0
  command -v "$PYTHON" >/dev/null 2>&1 || die "no $PYTHON on PATH: set PYTHON=/path/to/python3.11"
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
    || die "$PYTHON is not Python 3.11 (the local CPU torch 2.13.0 wheel is cp311): set PYTHON=/path/to/python3.11"
  say "installing $SGLANG_PIN (CPU, test-only stand-ins) into $VENV with $PYTHON (~3 min the first time)"
  [ -x "$VENV/bin/python" ] || run "$PYTHON" -m venv "$VENV" || die "could not create $VENV with $PYTHON -m venv"
  # torch first, alone: anything that resolves torch later then finds 2.13.0 (and pulls no CUDA build).
  run "$VENV/bin/python" -m pip install -qq "$TORCH_PIN" || die "pip install $TORCH_PIN failed (see above)"
  run "$VENV/bin/python" -m pip install -qq "$TORCH_PIN" "${DEPS[@]}" \
    || die "pip install of sglang's dependencies failed (see above)"
  # --no-deps: its own requirements pin CUDA torch 2.14.1, flashinfer, sgl-kernel and the CUDA stack.
  run "$VENV/bin/python" -m pip install -qq --no-deps "$SGLANG_PIN" \
    || die "pip install --no-deps $SGLANG_PIN failed (see above)"
  local site
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    || die "no site-packages in $VENV"
  for pkg in _hljax_test_standin sgl_kernel torchvision; do
    run rm -rf "$site/$pkg"
    run cp -r "$STUBS/$pkg" "$site/$pkg"
  done
  [ "${HLJAX_DRY_RUN:-0}" = 1 ] || echo "$key" >"$stamp"
}

serve() {
  [ $# -ge 1 ] || die "usage: scripts/sglang_mainline.sh serve EXPORT [--port P] [launch_server flags...]"
  local model="$1"; shift
  [ -f "$model/config.json" ] || die "$model has no config.json: pass an hf.save_hf / launch.export folder"
  setup
  # fp32 weights and KV (greedy output is compared with transformers' fp32), a small KV pool (the default
  # takes most of the machine's memory), no CUDA graphs. --enable-deterministic-inference refuses
  # torch_native attention, so seeded sampling does not reproduce on this set-up.
  SGLANG_USE_CPU_ENGINE=1 run exec "$VENV/bin/python" -m sglang.launch_server --model-path "$model" --device cpu \
    --attention-backend torch_native --disable-overlap-schedule --dtype float32 --context-length 1024 \
    --max-total-tokens 4096 --max-running-requests 8 --chunked-prefill-size 1024 --max-prefill-tokens 1024 \
    --mem-fraction-static 0.1 "$@"
}

case "${1:-}" in
  setup) setup ;;
  serve) shift; serve "$@" ;;
  *) die "usage: scripts/sglang_mainline.sh setup | serve EXPORT [--port P] [launch_server flags...]" ;;
esac
