#!/bin/bash
# Twenty-third session, last call (bundle of tile 40: 28 with the tail tile by TMA).
# On any card: tile 40's correctness (the long tests, the tile tests at head dims
# 64/128/256, the CPU match), then the prefill bench of 28 against 40 (and Auto, 17)
# beside torch SDPA. Then on an H200 every open H200 figure with what is left
# (s23-h200.sh); elsewhere an ncu of tile 40 at 32/8 b=1 L=4096.
TOTAL=${BUDGET:-560}; T0=$(date +%s)
( BUDGET=200; source .gpu/lib.sh
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  G=$T/kernel-runtime-gpu_prefill
  t 40 wg_long env MINISGL_TEST_PREFILL_TILES=40 $G prefill_attention_gpu_wgmma_long --test-threads=1
  t 60 wg_tiles env MINISGL_TEST_PREFILL_TILES=40 $G prefill_attention_gpu_wgmma_tiles --test-threads=1
  t 30 matches $G prefill_attention_gpu_matches_cpu --test-threads=1
  TILES=17,28,40
  MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=$TILES timeout 70 $BB/minisgl-attention "prefill" --bench --warm-up-time 0.1 --measurement-time 0.25 > $W/bench.log 2>&1
  echo "bench rc=$? tiles $TILES ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/bench.log >> $S
  PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
  echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S )
cp $OUT/summary.txt $OUT/pre.txt; cp $OUT/logs.tgz $OUT/pre-logs.tgz 2>/dev/null
REST=$(( TOTAL - ($(date +%s) - T0) ))
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  BUDGET=$REST bash .gpu/2026-12-07-s23-h200.sh
else
  BUDGET=$(( REST < 150 ? REST : 150 ))
  source .gpu/lib.sh
  ncu_prefill 40 "32/8 b=1 L=4096"
  echo "end at $(( $(date +%s) - START )) s" >> $S
fi
cat $OUT/pre.txt
