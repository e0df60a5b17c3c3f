#!/bin/bash
# Twenty-fourth session, call B: call A cut to what little device time was left after
# ten refused starts (same bundle: tiles 41, 42 and 43, 28, 35 and 29 in
# FlashAttention-3's order). The long test of 28 and 41..43 first, then the prefill
# bench of 17, 28 and 41..43 beside torch SDPA, then the other correctness tests with
# what is left.
BUDGET=${BUDGET:-250}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
G=$T/kernel-runtime-gpu_prefill
t 50 wg_long env MINISGL_TEST_PREFILL_TILES=28,41,42,43 $G prefill_attention_gpu_wgmma_long --test-threads=1
TILES=17,28,41,42,43
MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=$TILES timeout 80 $BB/minisgl-attention "prefill" --bench --warm-up-time 0.1 --measurement-time 0.2 > $W/bench.log 2>&1
echo "bench rc=$? tiles $TILES ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/bench.log >> $S
PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
t 40 wg_tiles env MINISGL_TEST_PREFILL_TILES=41,43 $G prefill_attention_gpu_wgmma_tiles --test-threads=1
t 25 matches $G prefill_attention_gpu_matches_cpu --test-threads=1
echo "end at $(( $(date +%s) - START )) s" >> $S
