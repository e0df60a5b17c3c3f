#!/bin/bash
# Twelfth session, call 6 (the bundle of call 5): batch-64 steps at short contexts cut every
# sequence in two (MINISGL_DECODE_GRAPH_SPLITS=2: twice the blocks, half the keys each),
# merged in clusters of 2 or by the combine launch; and the Qwen3-30B-A3B graphed step at
# the session's defaults (cluster merge off), not measured since the MoE decode kernels.
source .gpu/lib.sh
for v in "1 0" "2 2" "2 0"; do set -- $v
  MINISGL_DECODE_GRAPH_SPLITS=$1 MINISGL_DECODE_CLUSTER=$2 step "splits=$1 cluster=$2" llama3_8b_graph_step_time_ctx128_gpu
  MINISGL_DECODE_GRAPH_SPLITS=$1 MINISGL_DECODE_CLUSTER=$2 step "splits=$1 cluster=$2" qwen3_0_6b_graph_step_time_gpu
done
MINISGL_DECODE_CLUSTER=0 step "cluster=0" qwen3_30b_a3b_graph_step_time_gpu
echo "end at $(( $(date +%s) - START )) s" >> $S
