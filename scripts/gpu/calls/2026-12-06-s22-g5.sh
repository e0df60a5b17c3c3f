#!/bin/bash
# Twenty-second session, the last device time (~300 s, bundle of the anchored overlap
# on 4a2239a's producer): the persistent walks (4a2239a's producer), the prefill bench
# of tiles 27, 28 (anchored overlap) and 35 (28 persistent) beside SDPA, then the CPU
# match and the long test of tile 28. On an H200 the headline figures instead.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  exec bash .gpu/2026-12-06-s22-h200.sh
fi
BUDGET=${BUDGET:-300}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
G=$T/kernel-runtime-gpu_prefill
t 50 walks $G prefill_attention_gpu_persistent_walks --test-threads=1
TILES=27,28,35
MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=$TILES timeout $(( $(left) > 150 ? 100 : $(left) - 35 )) $BB/minisgl-attention "prefill" --bench --warm-up-time 0.1 --measurement-time 0.2 > $W/bench.log 2>&1
echo "bench rc=$? tiles $TILES ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/bench.log >> $S
t 25 matches $G prefill_attention_gpu_matches_cpu --test-threads=1
[ $(left) -gt 50 ] && { PYTHONUNBUFFERED=1 timeout 45 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
  echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S; }
t 50 wg_long env MINISGL_TEST_PREFILL_TILES=28 $G prefill_attention_gpu_wgmma_long --test-threads=1
t 50 wg_tiles env MINISGL_TEST_PREFILL_TILES=28 $G prefill_attention_gpu_wgmma_tiles --test-threads=1
echo "end at $(( $(date +%s) - START )) s" >> $S
