#!/bin/bash
# Fourteenth session, call 2 (prepared, not run: no machine was lent in the session):
# Qwen3-30B-A3B's decode step (bs=1: 3.6-4.1 ms against the 2.2 ms target; 48 layers of
# about eleven dependent launches each), three changes that each take a link out of
# every layer's chain, off by default until measured here:
#  - MINISGL_MOE_FUSED_ROUTER=1: the router GEMM and the routing in one launch;
#  - MINISGL_SKINNY_WEIGHT_MIB=1,24: the skinny window widened to the 20 MiB qkv, so
#    the pre-norm variant takes the layer's input norm into the qkv launch (cuBLASLt
#    and a norm launch today; Llama-3-8B's projections stay outside at >= 32 MiB);
#  - MINISGL_DECODE_FUSED_ROPE=1 (call 1's change).
# Tests first (the fused router against the GEMM + routing; MoE graphs replay = eager
# with the router fused; the Qwen3-MoE fixture in bf16 on both backends, with and without
# the fused router: models-moe_fixtures, in the bundle since this session, never run on
# a GPU before), then a round of the 30B graphed step (plain, each change alone, all
# three), the MoE bench's decode lines (the decode kernels' block width: 8 columns make
# 1.5 waves of gate_up blocks at one token; 16, 32, 64 swept), and a second round.
BUDGET=${BUDGET:-570}
source .gpu/lib.sh
( t 200 moe $T/kernel-runtime-gpu_moe gpu_fused_router --test-threads=1 --nocapture ) &
( export MINISGL_MOE_FUSED_ROUTER=1; t 150 graphs $T/engine-gpu_graphs qwen3_moe --test-threads=1; t 120 moefix-router $T/models-moe_fixtures gpu_bf16 --test-threads=1 ) &
( t 120 moefix $T/models-moe_fixtures gpu_bf16 --test-threads=1 ) &
wait
grep 'SUMMARY fused router' $W/moe.log >> $S
echo "tests done at $(( $(date +%s) - START )) s" >> $S
R=MINISGL_MOE_FUSED_ROUTER=1; N=MINISGL_SKINNY_WEIGHT_MIB=1,24; F=MINISGL_DECODE_FUSED_ROPE=1
round() {
  step_with "r$1 plain" qwen3_30b_a3b_graph_step_time_gpu
  step_with "r$1 router" qwen3_30b_a3b_graph_step_time_gpu $R
  step_with "r$1 window" qwen3_30b_a3b_graph_step_time_gpu $N
  step_with "r$1 rope" qwen3_30b_a3b_graph_step_time_gpu $F
  step_with "r$1 all" qwen3_30b_a3b_graph_step_time_gpu $R $N $F
}
round 1
# The MoE decode kernels' block width (moe-decode-cols lines; the tile sweep skipped).
( export MINISGL_MOE_BENCH_TILES=none; timeout 120 $BB/minisgl-moe --bench > $W/bench-moe.log 2>&1; echo "moe bench rc=$?" >> $S; grep -E 'SUMMARY moe-(decode|grouped)' $W/bench-moe.log >> $S )
round 2
echo "end at $(( $(date +%s) - START )) s" >> $S
