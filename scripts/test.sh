#!/usr/bin/env bash
# The test command: sets up the toolchain (scripts/env.sh), checks formatting,
# builds the workspace once (linted by clippy in the same build, warnings are
# errors), builds the kernels ahead of time, fetches the SmolLM2 demo model
# (`minisgl pull smollm2`, once), installs headless Chromium for the chat page's
# test (scripts/ci/browser.sh, once), runs every test of the workspace, and runs
# every fuzz target for a bounded time (scripts/ci/fuzz.sh). No GPU needed; GPU
# tests run too when MINISGL_GPU_TESTS=1 is set on a machine with one.
#
# CI has two cores, so independent steps run side by side where one alone
# leaves a core idle (serial compile tails, tests waiting on servers and
# clients): nvcc beside the workspace build (from when that build has linked the
# xtask binary), the fuzz build, niced, beside everything up to the fuzz runs.
# A background step writes target/ci-logs/NAME.log, printed when the script
# waits for it; a failed one fails the run. Each step prints its wall time, so a
# slow CI run shows where it went.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "$MINISGL_ROOT"

_phase_start=$SECONDS
phase_done() {
    printf 'minisgl test: %-14s %4ds\n' "$1" $((SECONDS - _phase_start)) >&2
    _phase_start=$SECONDS
}

CI_LOGS=target/ci-logs
mkdir -p "$CI_LOGS"
declare -A _bg_pid
# background NAME CMD...: runs CMD in the background, its output in NAME.log.
background() {
    local name=$1
    shift
    rm -f "$CI_LOGS/$name.rc"
    (
        start=$SECONDS
        set +e
        "$@" >"$CI_LOGS/$name.log" 2>&1
        rc=$?
        echo "$rc" >"$CI_LOGS/$name.rc"
        printf 'minisgl test: %-14s %4ds (in the background)\n' "$name" $((SECONDS - start)) >>"$CI_LOGS/$name.log"
    ) &
    _bg_pid[$name]=$!
}
# await NAME: waits for a background step, prints its log, fails if it failed.
await() {
    local name=$1 rc
    wait "${_bg_pid[$name]}" || true
    unset "_bg_pid[$name]"
    cat "$CI_LOGS/$name.log" >&2
    rc=$(cat "$CI_LOGS/$name.rc" 2>/dev/null || echo "missing")
    if [ "$rc" != 0 ]; then
        echo "minisgl test: $name failed (exit status $rc; log: $CI_LOGS/$name.log)" >&2
        exit 1
    fi
    phase_done "wait $name"
}
# Background steps still running when the script fails stop with it (their
# whole process trees: cargo, rustc, nvcc).
kill_tree() {
    local child
    for child in $(pgrep -P "$1" || true); do kill_tree "$child"; done
    kill "$1" 2>/dev/null || true
}
trap 'for pid in "${_bg_pid[@]}"; do kill_tree "$pid"; done' EXIT

cargo fmt --all -- --check
phase_done "fmt"
background browser scripts/ci/browser.sh
# The fuzz targets' build (nightly, its own target dir) shares no artifacts with
# the test build; niced, it takes what the foreground leaves.
background fuzz-build nice -n 19 scripts/ci/fuzz.sh build
# Clippy inside the test build: our crates compile through clippy-driver (rustc
# with clippy's lints), warnings denied, so one build both lints (as `cargo clippy
# --workspace --all-targets -- -D warnings` would) and produces the test binaries,
# instead of a second, check-mode build of every dependency. Exported, so that the
# test run below finds the same artifacts. CLIPPY_ARGS is how `cargo clippy` passes
# its arguments to the driver; the probe checks that a lint still fails the build.
RUSTC_WORKSPACE_WRAPPER=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver)
CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
export RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
probe_dir=$(mktemp -d)
echo 'fn main() { let x = 1u32; let _y = x.clone(); }' >"$probe_dir/probe.rs"
probe_rc=0
probe_out=$("$RUSTC_WORKSPACE_WRAPPER" rustc --edition 2021 --emit=metadata --out-dir "$probe_dir" \
    "$probe_dir/probe.rs" 2>&1) || probe_rc=$?
rm -rf "$probe_dir"
if [ "$probe_rc" = 0 ] || ! grep -q 'clone-on-copy` implied by `-D warnings`' <<<"$probe_out"; then
    echo "minisgl test: clippy-driver ($RUSTC_WORKSPACE_WRAPPER) did not deny a lint with CLIPPY_ARGS=$CLIPPY_ARGS:" >&2
    echo "$probe_out" >&2
    exit 1
fi
# One build for everything: the test binaries, the benches (linted, not run), the
# `minisgl` binary the tests run (and that `pull` uses below) and the `xtask`
# binary (xtask's CLI test runs it) come from this one `cargo test` build, in one
# profile and one feature set. (A separate `cargo build -p engine`, or `cargo
# xtask`, resolves other features and rebuilds part of the dependency tree.)
# nvcc starts as soon as that build has linked the xtask binary, so that the
# kernels' compiles fill the build's serial stretches (one core idle) instead of
# following it: 683 + 112 s against 673 + 206 s (docs/PERF.md, twenty-eighth session).
build_started=$CI_LOGS/build-started
build_ended=$CI_LOGS/build-ended
rm -f "$build_ended"
touch "$build_started"
background kernels bash -c '
    # The binary this build links (newer than its start), or, once the build has
    # ended without relinking it (nothing changed), the one already there.
    until [ target/debug/xtask -nt "$1" ] || [ -e "$2" ]; do sleep 2; done
    if [ ! -x target/debug/xtask ]; then echo "the build made no target/debug/xtask" >&2; exit 1; fi
    exec target/debug/xtask build-kernels' _ "$build_started" "$build_ended"
build_rc=0
cargo test --workspace --no-run --all-targets || build_rc=$?
touch "$build_ended"
[ "$build_rc" = 0 ] || exit "$build_rc"
phase_done "build"
await kernels
MINISGL_SMOLLM2_GGUF=$(target/debug/minisgl pull smollm2)
if [ ! -f "$MINISGL_SMOLLM2_GGUF" ]; then
    echo "minisgl pull smollm2 printed '$MINISGL_SMOLLM2_GGUF', not the path of a file" >&2
    exit 1
fi
export MINISGL_SMOLLM2_GGUF
phase_done "pull"
await browser
# Every test binary runs even when one fails, so one run shows every failure.
cargo test --workspace --no-fail-fast "$@"
phase_done "test"
await fuzz-build
scripts/ci/fuzz.sh run # every cargo-fuzz target for FUZZ_SECONDS (20) each
phase_done "fuzz"
