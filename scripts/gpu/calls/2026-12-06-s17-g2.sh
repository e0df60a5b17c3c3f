#!/bin/bash
# Seventeenth session, call 2: the skinny GEMM's bulk prefetch (MINISGL_SKINNY_BULK=1:
# the block's whole slice of w by the copy engine before the dependency wait) and the
# K split of small grids (MINISGL_SKINNY_SPLIT=2: Qwen3-0.6B's 64-tile o_proj and down
# on 128 blocks), both off by default. Call 1's timeline: launching o_proj 6 us
# earlier (launch-first) left its link at 6.4 us, so its weights stream at ~10-15 GB/s
# a block whenever it starts. Correctness first (bulk = cp.async bit for bit, the
# splits against the CPU, graph replay = eager and the fixtures through graphs with
# both on), then alternating rounds of the Qwen3-0.6B graphed step, then the
# timeline of the best setting.
BUDGET=${BUDGET:-540}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
t 150 fused $T/kernel-runtime-gpu_fused skinny --test-threads=1
( export MINISGL_SKINNY_BULK=1 MINISGL_SKINNY_SPLIT=2
  t 70 graphs $T/engine-gpu_graphs graph_replay_equals_eager_step dense_fixtures --test-threads=1
  t 60 overlap $T/engine-gpu_overlap --test-threads=1 )
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
BULK=(MINISGL_SKINNY_BULK=1); SPLIT=(MINISGL_SKINNY_SPLIT=2); BOTH=(MINISGL_SKINNY_BULK=1 MINISGL_SKINNY_SPLIT=2)
vars() { v=(); case $1 in bulk) v=("${BULK[@]}");; split) v=("${SPLIT[@]}");; both) v=("${BOTH[@]}");;
  bothlf) v=("${BOTH[@]}" MINISGL_PDL_LAUNCH_FIRST=1);; esac; }
for i in 1 2; do
  for w in default bulk split both bothlf; do vars $w; step_with "r$i $w" qwen3_0_6b_graph_step_time_gpu "${v[@]}"; done
  echo "round $i done at $(( $(date +%s) - START )) s" >> $S
done
bench() { [ $(left) -lt 50 ] && return; vars $2
  env "${v[@]}" timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench-$1-$2.log 2>&1
  echo "$1 $2 bench rc=$? $(grep -E 'output throughput|^time' $W/bench-$1-$2.log | tr '\n' ' ')" >> $S; }
bench r1 both; bench r1 default
if [ -e .gpu/libkernel_timeline.so ] && [ $(left) -gt 50 ]; then
  MINISGL_SKINNY_BULK=1 MINISGL_SKINNY_SPLIT=2 CUDA_INJECTION64_PATH=$ROOT/.gpu/libkernel_timeline.so MINISGL_TIMELINE=$W/timeline-both.csv \
    timeout 45 $T/engine-gpu_graphs qwen3_0_6b_graph_step_time_gpu --test-threads=1 --nocapture > $W/timeline-both.log 2>&1
  echo "timeline rc=$? $(grep -E 'SUMMARY graph-step' $W/timeline-both.log | tr '\n' ' ')" >> $S
  python3 scripts/gpu/timeline_table.py $W/timeline-both.csv --graph 32 --layer 7,2 2>&1 | grep -E "layer" >> $S
  gzip -f $W/timeline-both.csv
fi
# The 30B's router (moe_route_kernel, phase 2: 12.8 us of a 79.9 us layer in the
# sixteenth session's timeline for 0.5 MiB of weights): ncu of two launches.
if [ $(left) -gt 70 ]; then
  # shellcheck disable=SC2086 # the sections are separate arguments
  timeout 60 ncu --clock-control none $NCU_SECTIONS --kernel-name regex:moe_route --launch-skip 100 --launch-count 2 \
    -o $W/route $T/engine-gpu_graphs qwen3_30b_a3b_graph_step_time_gpu --test-threads=1 > $W/ncu-route.log 2>&1
  echo "ncu route rc=$?" >> $S
  ncu -i $W/route.ncu-rep --print-details all > $W/route-details.txt 2>&1
  ncu -i $W/route.ncu-rep --page source --csv --print-source sass > $W/route-sass.csv 2>&1
  grep -E "Duration|Grid Size|Block Size|Registers Per|Warp Cycles Per Issued|DRAM Throughput" $W/route-details.txt | head -12 >> $S
fi
echo "end at $(( $(date +%s) - START )) s" >> $S
