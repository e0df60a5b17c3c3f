#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ for a bounded time (FUZZ_SECONDS
# each, default 20), starting from its seed corpus in fuzz/corpus/<target>.
# Installs the pinned cargo-fuzz if it is missing, builds every target once
# (no sanitizer: the crates under test are safe Rust, and the panics, hangs
# and unbounded allocations we look for need none; debug assertions on, so
# overflows panic), and fails on the first crash, timeout or out-of-memory
# report, leaving the input in fuzz/artifacts/<target>/.
#
#   scripts/ci/fuzz.sh [build|run]   only build, or only run (built already);
#                                    both by default
#
# Targets run FUZZ_JOBS at a time (default: the number of cores; a fuzzer is
# one process on one core), each with its output in fuzz/work/<target>.log,
# printed when it ends.
set -euo pipefail
# The fuzz build is nightly's: not the stable clippy-driver that scripts/test.sh
# builds the workspace through.
unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
source "$(dirname "$0")/../env.sh"
cd "$MINISGL_ROOT/fuzz"

CARGO_FUZZ_VERSION=0.12.0
SECONDS_PER_TARGET=${FUZZ_SECONDS:-20}
JOBS=${FUZZ_JOBS:-$(nproc)}
what=${1:-all}
case "$what" in
build | run | all) ;;
*)
    echo "usage: scripts/ci/fuzz.sh [build|run]" >&2
    exit 2
    ;;
esac
build=(--dev --sanitizer none --debug-assertions)

if [ "$what" != run ]; then
    if ! cargo fuzz --version 2>/dev/null | grep -qF "$CARGO_FUZZ_VERSION"; then
        cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
    fi
    cargo +nightly fuzz build "${build[@]}"
fi
[ "$what" = build ] && exit 0

# fuzz_target NAME: one target for SECONDS_PER_TARGET, its log printed after.
fuzz_target() {
    local target=$1 rc=0
    # New inputs go to work/, so the committed seeds stay as they are.
    mkdir -p "work/$target"
    cargo +nightly fuzz run "${build[@]}" "$target" "work/$target" "corpus/$target" -- \
        -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1 >"work/$target.log" 2>&1 || rc=$?
    {
        echo "minisgl fuzz: $target for ${SECONDS_PER_TARGET}s: exit status $rc"
        if [ "$rc" = 0 ]; then grep -E '^(Done|stat::)' "work/$target.log"; else cat "work/$target.log"; fi
    } >&2
    return "$rc"
}

pids=()
failed=0
for target in $(cargo +nightly fuzz list); do
    # At most JOBS at once: wait for the oldest before starting another.
    if [ "${#pids[@]}" -ge "$JOBS" ]; then
        wait "${pids[0]}" || failed=1
        pids=("${pids[@]:1}")
    fi
    fuzz_target "$target" &
    pids+=($!)
done
for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
done
if [ "$failed" != 0 ]; then
    echo "minisgl fuzz: a target failed (its report above; the input in fuzz/artifacts/)" >&2
    exit 1
fi
