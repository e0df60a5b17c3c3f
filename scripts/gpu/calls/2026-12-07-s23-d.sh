#!/bin/bash
# Twenty-third session, the one long call the device time left allows (bundle of the
# tile-28 default and tile 39). First, on any card, the correctness of the new default
# and the new tile (the CPU match, the long tests of 28 and 39, the tile tests of 28,
# 35 and 39). Then on an H200 every open H200 figure (s23-h200.sh, with what is
# left); elsewhere the prefill bench (Auto, 17, 27, 28, 39) beside torch SDPA, the
# Qwen3-0.6B bs=1 step and the 0.6B bench under the new default.
TOTAL=${BUDGET:-570}; T0=$(date +%s)
( BUDGET=170; source .gpu/lib.sh
  nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
  G=$T/kernel-runtime-gpu_prefill
  t 40 matches $G prefill_attention_gpu_matches_cpu --test-threads=1
  t 60 wg_long env MINISGL_TEST_PREFILL_TILES=28,39 $G prefill_attention_gpu_wgmma_long --test-threads=1
  t 70 wg_tiles env MINISGL_TEST_PREFILL_TILES=28,35,39 $G prefill_attention_gpu_wgmma_tiles --test-threads=1 )
cp $OUT/summary.txt $OUT/pre.txt; cp $OUT/logs.tgz $OUT/pre-logs.tgz 2>/dev/null
REST=$(( TOTAL - ($(date +%s) - T0) ))
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  BUDGET=$REST bash .gpu/2026-12-07-s23-h200.sh
else
  BUDGET=$REST
  source .gpu/lib.sh
  TILES=17,27,28,39
  MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=$TILES timeout $(( $(left) > 200 ? 110 : $(left) / 2 )) $BB/minisgl-attention "prefill" --bench --warm-up-time 0.1 --measurement-time 0.25 > $W/bench.log 2>&1
  echo "bench rc=$? tiles $TILES ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/bench.log >> $S
  [ $(left) -gt 40 ] && { PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
    echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S; }
  step_with "r1" qwen3_0_6b_graph_step_time_gpu
  [ $(left) -gt 50 ] && { timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/mbench.log 2>&1
    echo "mbench rc=$? $(grep -E 'output throughput|^time' $W/mbench.log | tr '\n' ' ')" >> $S; }
  ncu_prefill 39 "32/8 b=1 L=4096"
  echo "end at $(( $(date +%s) - START )) s" >> $S
fi
cat $OUT/pre.txt
