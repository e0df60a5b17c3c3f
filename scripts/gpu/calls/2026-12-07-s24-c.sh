#!/bin/bash
# Twenty-fourth session, call C: the last ~150 s of device time. The prefill bench of
# 28 against 41 and 43 (FlashAttention-3's order) beside torch SDPA, then the long test
# of 41 and 43 with what is left.
BUDGET=${BUDGET:-150}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
TILES=28,41,43
MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=$TILES timeout 75 $BB/minisgl-attention "prefill" --bench --warm-up-time 0.1 --measurement-time 0.2 > $W/bench.log 2>&1
echo "bench rc=$? tiles $TILES ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/bench.log >> $S
PYTHONUNBUFFERED=1 timeout 35 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
t 30 wg_long env MINISGL_TEST_PREFILL_TILES=41,43 $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_long --test-threads=1
echo "end at $(( $(date +%s) - START )) s" >> $S
