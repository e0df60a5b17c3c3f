#!/bin/bash
# Twenty-third session, the short last call the device time left allows (bundle of
# tile 40): tile 40's long test, the prefill bench of 28 against 40 beside torch
# SDPA, then tile 40's tile tests (head dims 64/128/256) with what is left.
BUDGET=${BUDGET:-200}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
G=$T/kernel-runtime-gpu_prefill
t 50 wg_long env MINISGL_TEST_PREFILL_TILES=40 $G prefill_attention_gpu_wgmma_long --test-threads=1
TILES=28,40
MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=$TILES timeout 60 $BB/minisgl-attention "prefill" --bench --warm-up-time 0.1 --measurement-time 0.25 > $W/bench.log 2>&1
echo "bench rc=$? tiles $TILES ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/bench.log | grep -v prefill-tile >> $S
PYTHONUNBUFFERED=1 timeout 35 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
t 80 wg_tiles env MINISGL_TEST_PREFILL_TILES=40 $G prefill_attention_gpu_wgmma_tiles --test-threads=1
echo "end at $(( $(date +%s) - START )) s" >> $S
