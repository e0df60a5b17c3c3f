#!/bin/bash
# Twenty-fifth session, call M (bundle of dbe77cc: Q by TMA in the TMA tiles, tile 46
# the default for runs of 512..3071 keys, 39 from 3072): the prefill tests with 17,
# 39, 46 (and 35 walking), the attention bench (Auto and 17, 39, 46) beside torch
# SDPA; then, on an H200, the open H200 figures (2026-12-06-s22-h200.sh) with the rest.
BUDGET=${BUDGET:-540}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
export MINISGL_TEST_PREFILL_TILES=17,39,46
t 120 matches $T/kernel-runtime-gpu_prefill prefill_attention_gpu_matches_cpu --test-threads=1
t 120 wg_long $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_long --test-threads=1
t 150 wg_tiles $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_tiles --test-threads=1
MINISGL_TEST_PREFILL_TILES=35 t 90 walks $T/kernel-runtime-gpu_prefill prefill_attention_gpu_persistent_walks --test-threads=1
t 120 fixtures $T/models-gpu_fixtures --test-threads=1
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=17,39,46 bench 80 attn-prefill $BB/minisgl-attention prefill
PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
echo "prefill part done at $(( $(date +%s) - START )) s" >> $S
if grep -q H200 $S && [ "$(left)" -gt 200 ]; then
  cp $S $OUT/prefill.txt
  BUDGET=$(( $(left) - 5 )) PREFILL_TILES=17,39,46 bash .gpu/2026-12-06-s22-h200.sh
fi
