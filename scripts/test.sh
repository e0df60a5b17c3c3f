#!/usr/bin/env bash
# The test command: sets up the toolchain (scripts/env.sh), checks formatting,
# builds the kernels ahead of time, builds the workspace once, fetches the
# SmolLM2 demo model (`minisgl pull smollm2`, once), installs headless Chromium
# for the chat page's test (scripts/ci/browser.sh, once), runs every test of the
# workspace, and lints it with clippy (warnings are errors). No GPU needed; GPU
# tests run too when MINISGL_GPU_TESTS=1 is set on a machine with one.
# It also runs every fuzz target for a bounded time (scripts/ci/fuzz.sh).
# Each phase prints its wall time, so a slow CI run shows where it went.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$MINISGL_ROOT"

_phase_start=$SECONDS
phase_done() {
    printf 'minisgl test: %-14s %4ds\n' "$1" $((SECONDS - _phase_start)) >&2
    _phase_start=$SECONDS
}

cargo fmt --all -- --check
phase_done "fmt"
cargo xtask build-kernels
phase_done "kernels"
# One build for everything: the test binaries and the `minisgl` binary they run
# (and that `pull` uses below) come from this one `cargo test` build, in one
# profile and one feature set. (A separate `cargo build -p engine` resolves
# other features and rebuilds much of the dependency tree.)
cargo test --workspace --no-run
phase_done "build"
MINISGL_SMOLLM2_GGUF=$(target/debug/minisgl pull smollm2)
if [ ! -f "$MINISGL_SMOLLM2_GGUF" ]; then
    echo "minisgl pull smollm2 printed '$MINISGL_SMOLLM2_GGUF', not the path of a file" >&2
    exit 1
fi
export MINISGL_SMOLLM2_GGUF
phase_done "pull"
scripts/ci/browser.sh
phase_done "browser"
# Every test binary runs even when one fails, so one run shows every failure.
cargo test --workspace --no-fail-fast "$@"
phase_done "test"
scripts/ci/fuzz.sh  # every cargo-fuzz target for FUZZ_SECONDS (20) each
phase_done "fuzz"
cargo clippy --workspace --all-targets -- -D warnings
phase_done "clippy"
