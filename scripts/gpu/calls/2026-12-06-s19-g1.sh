#!/bin/bash
# Nineteenth session, call 1: the warp-specialised prefill tiles (22..26: a producer
# warpgroup gathering K/V by cp.async onto transaction barriers, two or three
# consumer warpgroups; 23/24/26 overlap the softmax with P V, 24/26 ping-pong) beside
# tile 17 (the default) and torch SDPA in the same run, then their correctness
# against the CPU (the new tiles compile at run time here: NVRTC), then a sanitizer
# pass over the barrier protocol.
BUDGET=${BUDGET:-540}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
A="--bench --warm-up-time 0.1 --measurement-time 0.3"
# 1. the tiles at issue 12's three shapes (bf16, head dim 128, page 16), SDPA after
MINISGL_BENCH_PREFILL_TILES=17,22,23,24,25,26 timeout 170 $BB/minisgl-attention "prefill-new" $A > $W/bench.log 2>&1
echo "bench rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/bench.log >> $S
PYTHONUNBUFFERED=1 timeout 60 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
echo "torch rc=$?" >> $S; grep SUMMARY $W/torch.log >> $S
# 2. correctness of the new tiles (and 17 after its refactor), long sequences first
t 110 wg_long env MINISGL_TEST_PREFILL_TILES=17,22,23,24,25,26 $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_long --test-threads=1
t 240 wg_tiles env MINISGL_TEST_PREFILL_TILES=17,22,23,24,25,26 $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_tiles --test-threads=1
# 3. racecheck and synccheck over the warp-specialised protocol (tiles 23 and 24, long)
for tool in racecheck synccheck; do
  [ $(left) -lt 40 ] && break
  MINISGL_TEST_PREFILL_TILES=23,24 timeout $(( $(left) - 10 )) compute-sanitizer --tool $tool $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_long --test-threads=1 > $W/san-$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' $W/san-$tool.log | tr '\n' ' ')" >> $S
done
echo "end at $(( $(date +%s) - START )) s" >> $S
