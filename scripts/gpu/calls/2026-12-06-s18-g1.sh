#!/bin/bash
# Eighteenth session, call 1: the seventeenth session's prepared call 5 (the H200
# headline figures under the bulk prefetch default, MINISGL_SKINNY_BULK_WIDE=1 with
# its tests and 30B A/B rounds, the 30B timeline), then ncu of the 30B's MoE decode
# kernels and fused router (graphed step test; kernels serialised by ncu, so these
# are the launches alone, not their links).
BUDGET=${BUDGET:-560}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
( export MINISGL_SKINNY_BULK_WIDE=1
  t 120 bulk $T/kernel-runtime-gpu_fused skinny_bulk --test-threads=1
  t 60 graphs $T/engine-gpu_graphs graph_replay_equals_eager_step --test-threads=1 )
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
for i in 1 2; do
  step_with "r$i default" qwen3_0_6b_graph_step_time_gpu
  step_with "r$i cp.async" qwen3_0_6b_graph_step_time_gpu MINISGL_SKINNY_BULK=0
done
step_with "r1 default" llama3_8b_graph_step_time_gpu
timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench.log 2>&1
echo "bench rc=$? $(grep -E 'output throughput|^time' $W/bench.log | tr '\n' ' ')" >> $S
WIDE=(MINISGL_SKINNY_BULK_WIDE=1)
for i in 1 2; do
  step_with "r$i default" qwen3_30b_a3b_graph_step_time_gpu
  step_with "r$i wide" qwen3_30b_a3b_graph_step_time_gpu "${WIDE[@]}"
done
if [ $(left) -gt 70 ]; then
  MINISGL_SKINNY_BULK_WIDE=1 CUDA_INJECTION64_PATH=$ROOT/.gpu/libkernel_timeline.so MINISGL_TIMELINE=$W/tl-30b.csv \
    timeout 60 $T/engine-gpu_graphs qwen3_30b_a3b_graph_step_time_gpu --test-threads=1 --nocapture > $W/tl-30b.log 2>&1
  echo "timeline rc=$?" >> $S
  python3 scripts/gpu/timeline_table.py $W/tl-30b.csv --graph 32 --layer 9,2 2>&1 | grep -E "graph 32:|layer" >> $S
  gzip -f $W/tl-30b.csv
fi
ncu_30b() { local name=$1 re=$2 skip=$3 count=$4; [ $(left) -lt 60 ] && { echo "ncu $name skipped" >> $S; return; }
  # shellcheck disable=SC2086
  timeout 55 ncu --clock-control none $NCU_SECTIONS --kernel-name regex:$re --launch-skip $skip --launch-count $count \
    -o $W/$name $T/engine-gpu_graphs qwen3_30b_a3b_graph_step_time_gpu --test-threads=1 > $W/ncu-$name.log 2>&1
  echo "ncu $name rc=$?" >> $S
  ncu -i $W/$name.ncu-rep --print-details all > $W/$name-details.txt 2>&1
  grep -E "Duration|Registers Per|Grid Size|Block Size|Achieved Occupancy|Warp Cycles Per Issued|DRAM Throughput|Memory Throughput" $W/$name-details.txt | head -24 >> $S
}
ncu_30b moe_decode moe_decode 960 2
ncu_30b moe_route moe_route 480 1
echo "end at $(( $(date +%s) - START )) s" >> $S
