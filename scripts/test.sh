#!/usr/bin/env bash
# The test command: sets up the toolchain (scripts/env.sh), builds the kernels
# ahead of time, fetches the SmolLM2 demo model (`minisgl pull smollm2`, once),
# and runs every test of the workspace. No GPU needed; GPU tests run too when
# MINISGL_GPU_TESTS=1 is set on a machine with one.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$MINISGL_ROOT"
cargo xtask build-kernels
cargo build -p engine --bin minisgl
MINISGL_SMOLLM2_GGUF=$(target/debug/minisgl pull smollm2)
if [ ! -f "$MINISGL_SMOLLM2_GGUF" ]; then
    echo "minisgl pull smollm2 printed '$MINISGL_SMOLLM2_GGUF', not the path of a file" >&2
    exit 1
fi
export MINISGL_SMOLLM2_GGUF
# Every test binary runs even when one fails, so one run shows every failure.
cargo test --workspace --no-fail-fast "$@"
