#!/usr/bin/env bash
# The test command: sets up the toolchain (scripts/env.sh), builds the kernels
# ahead of time, and runs every test of the workspace. No GPU needed; GPU tests
# run too when MINISGL_GPU_TESTS=1 is set on a machine with one.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$MINISGL_ROOT"
cargo xtask build-kernels
cargo test --workspace "$@"
