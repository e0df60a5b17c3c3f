#!/bin/bash
# Eighteenth session, call 3 (call 2's bundle had a half-made moe_decode.cu and lost
# its MoE figures): the router rewrite (a block per expert, the row in registers
# before the wait, its own kernel) and the wide bulk prefetch as defaults, the down
# pass staged by the copy engine (MINISGL_MOE_DECODE_BULK=1, off) with its tests,
# the 30B step A/B and the decode kernels' columns swept, the 30B timeline (the
# router's link was 12.77 us on two H100s), ncu of the new router launch alone.
BUDGET=${BUDGET:-570}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
t 100 router $T/kernel-runtime-gpu_moe gpu_fused_router --test-threads=1 --nocapture
t 150 decode $T/kernel-runtime-gpu_moe gpu_decode_kernels --test-threads=1 --nocapture
( export MINISGL_MOE_DECODE_BULK=1
  t 90 moe_replay $T/engine-gpu_graphs graph_replay_equals_eager_step_qwen3_moe_gpu --test-threads=1
  t 120 moe_fix $T/models-moe_fixtures gpu_bf16 --test-threads=1 )
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
grep -h SUMMARY $W/router.log $W/decode.log >> $S
for i in 1 2; do
  step_with "r$i default" qwen3_30b_a3b_graph_step_time_gpu
  step_with "r$i bulk-down" qwen3_30b_a3b_graph_step_time_gpu MINISGL_MOE_DECODE_BULK=1
  step_with "r$i router-off" qwen3_30b_a3b_graph_step_time_gpu MINISGL_MOE_FUSED_ROUTER=0
done
step_with "narrow" qwen3_30b_a3b_graph_step_time_gpu MINISGL_SKINNY_BULK_WIDE=0
for c in 12 16 4; do step_with "cols $c" qwen3_30b_a3b_graph_step_time_gpu MINISGL_MOE_DECODE_COLS=$c; done
step_with "cols 4 bulk-down" qwen3_30b_a3b_graph_step_time_gpu MINISGL_MOE_DECODE_COLS=4 MINISGL_MOE_DECODE_BULK=1
if [ $(left) -gt 80 ]; then
  MINISGL_MOE_DECODE_BULK=1 CUDA_INJECTION64_PATH=$ROOT/.gpu/libkernel_timeline.so MINISGL_TIMELINE=$W/tl-30b.csv \
    timeout 60 $T/engine-gpu_graphs qwen3_30b_a3b_graph_step_time_gpu --test-threads=1 --nocapture > $W/tl-30b.log 2>&1
  echo "timeline (bulk-down) rc=$?" >> $S
  python3 scripts/gpu/timeline_table.py $W/tl-30b.csv --graph 32 --layer 9,2 2>&1 | grep -E "graph 32:|layer" >> $S
  gzip -f $W/tl-30b.csv
fi
if [ $(left) -gt 100 ]; then
  timeout 90 ncu --clock-control none $NCU_SECTIONS --kernel-name regex:moe_router --launch-skip 100 --launch-count 2 \
    -o $W/router $T/models-gpu_dummy qwen3_30b_a3b_dummy_decode_bs1 --test-threads=1 > $W/ncu-router.log 2>&1
  echo "ncu router rc=$?" >> $S
  ncu -i $W/router.ncu-rep --print-details all > $W/router-details.txt 2>&1
  grep -E "Duration|Registers Per|Grid Size|Achieved Occupancy|Warp Cycles Per Issued|DRAM Throughput" $W/router-details.txt | head -14 >> $S
fi
echo "end at $(( $(date +%s) - START )) s" >> $S
