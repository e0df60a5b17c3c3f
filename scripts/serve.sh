#!/usr/bin/env bash
# The quick start: sets up the toolchain (scripts/env.sh), builds the kernels and
# the release binary, and serves a model with the OpenAI-compatible server, on
# the GPU when there is one and on the CPU otherwise.
#   scripts/serve.sh [MODEL] [extra minisgl serve flags...]
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$MINISGL_ROOT"
MODEL=${1:-tests/fixtures/qwen3-tiny}
shift || true
cargo xtask build-kernels
cargo build --release --bin minisgl
export MINISGL_KERNELS="$MINISGL_ROOT/target/kernels"
exec target/release/minisgl serve --model "$MODEL" --device auto --host 127.0.0.1 --port 30000 "$@"
