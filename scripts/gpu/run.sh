#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, over a bundle made by
# `cargo xtask gpu-bundle` (.gpu/). Steps come from $MINISGL_GPU_STEPS (default
# "info tests bench torch"); logs go to $OUT (or /tmp/minisgl-out); a summary
# table is printed last.
#
#   info   nvidia-smi, driver, torch versions
#   tests  every bundled test binary whose name matches $MINISGL_GPU_TEST_FILTER
#          (default: gpu), with MINISGL_GPU_TESTS=1
#   bench  every bundled bench binary matching $MINISGL_GPU_BENCH_FILTER (default: .)
#   torch  scripts/gpu/torch_baselines.py: the torch figures to compare with
#   cmd    the command in $MINISGL_GPU_CMD (e.g. a minisgl bench run)
set -uo pipefail
ROOT=$(pwd)
OUT=${OUT:-/tmp/minisgl-out}
mkdir -p "$OUT"
BUNDLE=$ROOT/.gpu
STEPS=${MINISGL_GPU_STEPS:-info tests bench torch}
# The binaries travel packed; unpack them once per machine.
BIN=/tmp/minisgl-bundle/bin
if [ ! -e /tmp/minisgl-bundle/.stamp ] || [ "$BUNDLE/bin.tar.xz" -nt /tmp/minisgl-bundle/.stamp ]; then
  rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle
  tar xJf "$BUNDLE/bin.tar.xz" -C /tmp/minisgl-bundle && touch /tmp/minisgl-bundle/.stamp
fi
export PATH="$BIN:$PATH"

export MINISGL_KERNELS=$BUNDLE/kernels
export MINISGL_CACHE_DIR=${MINISGL_CACHE_DIR:-/tmp/minisgl-cache}
export MINISGL_GPU_TESTS=1
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export RUST_BACKTRACE=1
# Test binaries were built elsewhere: make their compile-time workspace path
# (for fixtures) point at this checkout.
BUILT_AT=$(cat "$BUNDLE/built_at" 2>/dev/null || echo /work/main)
if [ ! -e "$BUILT_AT" ]; then mkdir -p "$(dirname "$BUILT_AT")" && ln -s "$ROOT" "$BUILT_AT"; fi

summary=()
record() { summary+=("$(printf '%-40s %s' "$1" "$2")"); }

for step in $STEPS; do
  case $step in
    info)
      { nvidia-smi; python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'; } >"$OUT/info.log" 2>&1
      record info "$(grep -m1 -o 'NVIDIA H[0-9A-Za-z ]*' "$OUT/info.log" || echo '?')"
      ;;
    tests)
      filter=${MINISGL_GPU_TEST_FILTER:-gpu}
      for t in "$BIN"/tests/*; do
        name=$(basename "$t")
        [[ $name =~ $filter ]] || continue
        timeout "${MINISGL_GPU_TEST_TIMEOUT:-400}" "$t" --test-threads=1 >"$OUT/test-$name.log" 2>&1
        rc=$?
        record "test $name" "rc=$rc $(grep -E '^test result' "$OUT/test-$name.log" | tail -1)"
      done
      ;;
    bench)
      filter=${MINISGL_GPU_BENCH_FILTER:-.}
      for b in "$BIN"/benches/*; do
        name=$(basename "$b")
        [[ $name =~ $filter ]] || continue
        timeout "${MINISGL_GPU_BENCH_TIMEOUT:-300}" "$b" --bench --warm-up-time 1 --measurement-time 3 >"$OUT/bench-$name.log" 2>&1
        record "bench $name" "rc=$?"
        grep -E '^SUMMARY' "$OUT/bench-$name.log" | sed 's/^SUMMARY //' | while read -r line; do echo "  $line"; done >>"$OUT/summary-bench.txt"
      done
      ;;
    torch)
      PYTHONUNBUFFERED=1 timeout 300 python3 scripts/gpu/torch_baselines.py >"$OUT/torch.log" 2>&1
      record torch "rc=$?"
      ;;
    cmd)
      bash -c "${MINISGL_GPU_CMD:-true}" >"$OUT/cmd.log" 2>&1
      record cmd "rc=$?"
      ;;
    *) record "$step" "unknown step" ;;
  esac
done

echo "==== details"
for f in "$OUT"/test-*.log; do
  [ -e "$f" ] || continue
  if grep -qE 'FAILED|panicked' "$f"; then echo "--- $(basename "$f")"; grep -E 'panicked|FAILED|failed|Error' "$f" | head -20; fi
done
[ -e "$OUT/summary-bench.txt" ] && { echo "--- bench"; cat "$OUT/summary-bench.txt"; }
[ -e "$OUT/torch.log" ] && { echo "--- torch"; grep -E '^SUMMARY' "$OUT/torch.log" | sed 's/^SUMMARY //'; }
[ -e "$OUT/cmd.log" ] && { echo "--- cmd"; tail -20 "$OUT/cmd.log"; }
echo "==== summary"
printf '%s\n' "${summary[@]}"
