#!/usr/bin/env bash
# The quick start: builds the release binary and serves a model with the
# OpenAI-compatible server, on the GPU when there is one and on the CPU
# otherwise. Without a MODEL it fetches the demo model, SmolLM2-135M-Instruct
# (GGUF Q4_1, `minisgl pull smollm2`).
#   scripts/serve.sh [MODEL] [extra minisgl serve flags...]
# With a GPU it first installs the CUDA compiler if there is none
# (scripts/setup.sh) and builds the kernels; without one (no NVIDIA driver, or
# `--device cpu` among the flags) it installs nothing and builds no kernels.
# Each phase is named as it starts, with its wall time when it ends.
# MINISGL_BIN=PATH serves with that binary instead of building one (tests).
set -euo pipefail
source "$(dirname "$0")/setup.sh"
cd "$MINISGL_ROOT"

_phase_start=$SECONDS
phase() {
  printf 'minisgl quick start: %s\n' "$1" >&2
  _phase_start=$SECONDS
}
phase_done() { printf 'minisgl quick start: done in %ds\n' $((SECONDS - _phase_start)) >&2; }

MODEL=""
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  MODEL=$1
  shift
fi
gpu=1
if ! _minisgl_has_gpu; then gpu=0; fi
# The flags may name the device: then they choose it, not this script.
device_flag=(--device auto)
prev=""
for arg in "$@"; do
  case "$arg" in
    --device=*) device_flag=() ;;
  esac
  if [ "$prev" = "--device" ]; then
    device_flag=()
    if [ "$arg" = cpu ]; then gpu=0; fi
  fi
  if [ "$arg" = "--device=cpu" ]; then gpu=0; fi
  prev=$arg
done
if [ "$gpu" = 0 ] && [ ${#device_flag[@]} -gt 0 ]; then device_flag=(--device cpu); fi

if [ "$gpu" = 1 ]; then
  phase "GPU found: setting up the CUDA compiler"
  _minisgl_cuda
  _minisgl_paths
  phase_done
  phase "building the kernels (cargo xtask build-kernels)"
  cargo xtask build-kernels
  phase_done
  export MINISGL_KERNELS="$MINISGL_ROOT/target/kernels"
else
  printf 'minisgl quick start: no GPU (or --device cpu): serving on the CPU; no CUDA compiler, no kernels\n' >&2
fi

BIN=${MINISGL_BIN:-}
if [ -z "$BIN" ]; then
  phase "building the release binary (cargo build --release -p engine)"
  cargo build --release -p engine --bin minisgl
  BIN="$MINISGL_ROOT/target/release/minisgl"
  phase_done
  printf 'minisgl quick start: the binary is %s (or `cargo install --path engine` puts minisgl on your PATH)\n' "$BIN" >&2
fi

if [ -z "$MODEL" ]; then
  phase "fetching the demo model (minisgl pull smollm2)"
  MODEL=$("$BIN" pull smollm2)
  phase_done
fi
# Whether the flags set option $1 (`--x V` or `--x=V`).
has_flag() {
  local name=$1 arg
  shift
  for arg in "$@"; do
    if [ "$arg" = "$name" ] || [ "${arg%%=*}" = "$name" ]; then return 0; fi
  done
  return 1
}
defaults=("${device_flag[@]}")
if ! has_flag --host "$@"; then defaults+=(--host 127.0.0.1); fi
if ! has_flag --port "$@"; then defaults+=(--port 30000); fi
phase "serving $MODEL"
exec "$BIN" serve --model "$MODEL" "${defaults[@]}" "$@"
