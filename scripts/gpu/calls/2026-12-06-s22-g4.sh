#!/bin/bash
# Twenty-second session, the one call the device time left allows (bundle of the
# anchored overlap on 4a2239a's producer). On an H200 the headline figures; elsewhere
# correctness first, for a short budget: the persistent walks (4a2239a's producer), the
# CPU match and the long tests of the overlapped tiles, then the prefill bench beside
# SDPA, the tile sweep of 28, an ncu of tile 28 if time is left.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  exec bash .gpu/2026-12-06-s22-h200.sh
fi
BUDGET=${BUDGET:-420}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
A="--bench --warm-up-time 0.1 --measurement-time 0.25"
G=$T/kernel-runtime-gpu_prefill
t 90 walks $G prefill_attention_gpu_persistent_walks --test-threads=1
t 30 matches $G prefill_attention_gpu_matches_cpu --test-threads=1
t 60 wg_long env MINISGL_TEST_PREFILL_TILES=28,35 $G prefill_attention_gpu_wgmma_long --test-threads=1
TILES=17,27,28,29,35
MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=$TILES timeout $(( $(left) > 140 ? 120 : $(left) - 20 )) $BB/minisgl-attention "prefill" $A > $W/bench.log 2>&1
echo "bench rc=$? tiles $TILES ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/bench.log >> $S
PYTHONUNBUFFERED=1 timeout 50 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
t 60 wg_tiles env MINISGL_TEST_PREFILL_TILES=28 $G prefill_attention_gpu_wgmma_tiles --test-threads=1
ncu_prefill 28 "32/8 b=1 L=4096"
echo "end at $(( $(date +%s) - START )) s" >> $S
