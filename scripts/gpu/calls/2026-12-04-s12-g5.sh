#!/bin/bash
# Twelfth session, call 5: the cluster-merging decode launch without programmatic dependent
# launch (MINISGL_DECODE_CLUSTER_PDL=0, the kernels around it keep theirs) against with it
# and against the combine launch, in the graphed Qwen3-0.6B and Llama-3-8B bs=1 steps.
source .gpu/lib.sh
for r in 1 2; do
  for v in "8 0" "8 1" "0 0"; do set -- $v
    MINISGL_DECODE_CLUSTER=$1 MINISGL_DECODE_CLUSTER_PDL=$2 step "r$r cluster=$1 pdl=$2" qwen3_0_6b_graph_step_time_gpu
  done
done
for v in "8 0" "0 0"; do set -- $v
  MINISGL_DECODE_CLUSTER=$1 MINISGL_DECODE_CLUSTER_PDL=$2 step "cluster=$1 pdl=$2" llama3_8b_graph_step_time_ctx128_gpu
done
echo "end at $(( $(date +%s) - START )) s" >> $S
