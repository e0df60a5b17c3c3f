#!/bin/bash
# Seventeenth session, call 3: the bulk prefetch's tests again (call 2's memcheck run
# failed the gated case's bitwise comparison with 0 errors reported; each path is now
# checked against the CPU, and the gated and pre-norm cases are their own test so the
# sanitizers can run them alone: memcheck, racecheck, synccheck), then alternating
# rounds of the Qwen3-0.6B graphed step: default, bulk, bulk with launch-first (call
# 2 measured launch-first only beside the K split, which lost), and both timelines.
BUDGET=${BUDGET:-520}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
t 90 bulk $T/kernel-runtime-gpu_fused skinny_bulk --test-threads=1
for tool in memcheck racecheck synccheck; do
  t 80 san-$tool compute-sanitizer --tool $tool --error-exitcode 9 $T/kernel-runtime-gpu_fused skinny_bulk_prefetch_is_bitwise_neutral_gated --test-threads=1
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error:|differs|Invalid|Race" $W/san-$tool.log | head -6 >> $W/t-san-$tool.sum
done
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
BULK=(MINISGL_SKINNY_BULK=1); BLF=(MINISGL_SKINNY_BULK=1 MINISGL_PDL_LAUNCH_FIRST=1)
vars() { v=(); case $1 in bulk) v=("${BULK[@]}");; bulklf) v=("${BLF[@]}");; esac; }
for i in 1 2; do
  for w in default bulk bulklf; do vars $w; step_with "r$i $w" qwen3_0_6b_graph_step_time_gpu "${v[@]}"; done
done
echo "rounds done at $(( $(date +%s) - START )) s" >> $S
for w in default bulklf; do
  [ $(left) -lt 40 ] && break; vars $w
  env "${v[@]}" CUDA_INJECTION64_PATH=$ROOT/.gpu/libkernel_timeline.so MINISGL_TIMELINE=$W/tl-$w.csv \
    timeout 45 $T/engine-gpu_graphs qwen3_0_6b_graph_step_time_gpu --test-threads=1 --nocapture > $W/tl-$w.log 2>&1
  echo "timeline $w rc=$?" >> $S
  python3 scripts/gpu/timeline_table.py $W/tl-$w.csv --graph 32 --layer 7,2 2>&1 | grep -E "graph 32:|layer" >> $S
  gzip -f $W/tl-$w.csv
done
echo "end at $(( $(date +%s) - START )) s" >> $S
