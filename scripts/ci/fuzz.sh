#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ for a bounded time (FUZZ_SECONDS
# each, default 20), starting from its seed corpus in fuzz/corpus/<target>.
# Installs the pinned cargo-fuzz if it is missing, builds every target once
# (no sanitizer: the crates under test are safe Rust, and the panics, hangs
# and unbounded allocations we look for need none; debug assertions on, so
# overflows panic), and fails on the first crash, timeout or out-of-memory
# report, leaving the input in fuzz/artifacts/<target>/.
set -euo pipefail
source "$(dirname "$0")/../env.sh"
cd "$MINISGL_ROOT/fuzz"

CARGO_FUZZ_VERSION=0.12.0
SECONDS_PER_TARGET=${FUZZ_SECONDS:-20}
if ! cargo fuzz --version 2>/dev/null | grep -qF "$CARGO_FUZZ_VERSION"; then
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi
build=(--dev --sanitizer none --debug-assertions)
cargo +nightly fuzz build "${build[@]}"
for target in $(cargo +nightly fuzz list); do
    # New inputs go to work/, so the committed seeds stay as they are.
    mkdir -p "work/$target"
    echo "minisgl fuzz: $target for ${SECONDS_PER_TARGET}s" >&2
    cargo +nightly fuzz run "${build[@]}" "$target" "work/$target" "corpus/$target" -- \
        -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1
done
