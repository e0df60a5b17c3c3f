#!/bin/bash
# Sixteenth session, call 2 (the bundle of call 1): round 2 of call 1's graphed steps and
# `minisgl bench` in reverse order, the Qwen3-30B-A3B step default against three warps,
# then ncu's per-instruction view of the fused-prologue and plain decode kernels (the
# fifteenth session's call 4), and the GPU tests that have not run in full since the
# ninth session (gpu_fused, gpu_ops), as far as the time goes.
BUDGET=${BUDGET:-575}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
THREE=(MINISGL_DECODE_STAGES=1 MINISGL_DECODE_GRAPH_STAGES=1)
FUSED=(MINISGL_DECODE_FUSED_ROPE=1)
for w in three default; do
  v=(); [ $w = three ] && v=("${THREE[@]}")
  env "${v[@]}" timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench-$w.log 2>&1
  echo "r2 $w bench rc=$? $(grep -E 'output throughput|^time' $W/bench-$w.log | tr '\n' ' ')" >> $S
done
for w in three default; do
  v=(); [ $w = three ] && v=("${THREE[@]}")
  step_with "r2 $w" llama3_8b_graph_step_time_ctx128_gpu "${v[@]}"
done
for w in fused three default; do
  v=(); [ $w = three ] && v=("${THREE[@]}"); [ $w = fused ] && v=("${FUSED[@]}")
  step_with "r2 $w" qwen3_0_6b_graph_step_time_gpu "${v[@]}"
done
for w in default three; do
  v=(); [ $w = three ] && v=("${THREE[@]}")
  step_with "r1 $w" qwen3_30b_a3b_graph_step_time_gpu "${v[@]}"
done
echo "steps done at $(( $(date +%s) - START )) s" >> $S
SECS="--section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section SpeedOfLight --section SourceCounters"
prof() { local name=$1; shift; [ $(left) -lt 70 ] && { echo "ncu $name skipped" >> $S; return; }
  env "$@" timeout 60 ncu --clock-control none $SECS --import-source no --kernel-name regex:decode_attention_kernel \
    --launch-skip 300 --launch-count 2 -o $W/$name $T/engine-gpu_graphs qwen3_0_6b_graph_step_time_gpu --test-threads=1 > $W/ncu-$name.log 2>&1
  echo "ncu $name rc=$?" >> $S
  ncu -i $W/$name.ncu-rep --print-details all > $W/$name-details.txt 2>&1
  ncu -i $W/$name.ncu-rep --page source --csv --print-source sass > $W/$name-sass.csv 2>&1
  grep -E "Duration|Registers Per|Grid Size|Block Size|Achieved Occupancy|Warp Cycles Per Issued" $W/$name-details.txt | head -14 >> $S
}
prof fused "${FUSED[@]}"
prof plain
echo "ncu done at $(( $(date +%s) - START )) s" >> $S
( t 200 fused $T/kernel-runtime-gpu_fused --test-threads=2 ) &
( t 200 ops $T/kernel-runtime-gpu_ops --test-threads=3 ) &
wait
echo "end at $(( $(date +%s) - START )) s" >> $S
