#!/usr/bin/env bash
# The quick start: sets up the toolchain (scripts/env.sh), builds the kernels and
# the release binary, and serves a model with the OpenAI-compatible server, on
# the GPU when there is one and on the CPU otherwise. Without a MODEL it fetches
# the demo model, SmolLM2-135M-Instruct (GGUF Q4_1, `minisgl pull smollm2`).
#   scripts/serve.sh [MODEL] [extra minisgl serve flags...]
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$MINISGL_ROOT"
cargo xtask build-kernels
cargo build --release -p engine --bin minisgl
export MINISGL_KERNELS="$MINISGL_ROOT/target/kernels"
if [ $# -gt 0 ]; then
  MODEL=$1
  shift
else
  MODEL=$(target/release/minisgl pull smollm2)
fi
exec target/release/minisgl serve --model "$MODEL" --device auto --host 127.0.0.1 --port 30000 "$@"
