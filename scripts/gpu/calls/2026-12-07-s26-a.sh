#!/bin/bash
# Twenty-sixth session, call A (bundle of dbe77cc: Q by TMA, = main's code plus
# scripts/gpu/experiments/prefill-q-tma.patch). On an H200: every open H200 figure
# first (2026-12-06-s22-h200.sh), then the prefill tests on Q by TMA with what is left.
# On any other card: call M of the twenty-fifth session (the prefill tests on Q by TMA,
# the attention bench beside torch SDPA).
BUDGET=${BUDGET:-585}
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  START0=$(date +%s)
  BUDGET=$(( BUDGET - 150 )) PREFILL_TILES=17,39,46 bash .gpu/2026-12-06-s22-h200.sh
  cp $OUT/summary.txt $OUT/h200.txt; cp $OUT/logs.tgz $OUT/h200-logs.tgz 2>/dev/null
  REST=$(( BUDGET - ($(date +%s) - START0) ))
  source .gpu/lib.sh; BUDGET=$REST; START=$(date +%s)
  export MINISGL_TEST_PREFILL_TILES=17,39,46
  t 60 matches $T/kernel-runtime-gpu_prefill prefill_attention_gpu_matches_cpu --test-threads=1
  t 60 wg_long $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_long --test-threads=1
  t 90 wg_tiles $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_tiles --test-threads=1
  cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
  cat $OUT/h200.txt >> $S
else
  BUDGET=$BUDGET bash scripts/gpu/calls/2026-12-07-s25-m.sh
fi
