#!/bin/bash
# Twelfth session, call 2: why the cluster merge made the graphed Qwen3-0.6B bs=1 step slower
# (call 1: 0.952 ms against 0.876 with it off) though each cold launch was faster: the
# step at cluster caps 16, 8 and 0, with and without programmatic dependent launch.
source .gpu/lib.sh
for c in 8 16 0; do MINISGL_DECODE_CLUSTER=$c step "cluster=$c" qwen3_0_6b_graph_step_time_gpu; done
for c in 16 0; do MINISGL_PDL=0 MINISGL_DECODE_CLUSTER=$c step "pdl=0 cluster=$c" qwen3_0_6b_graph_step_time_gpu; done
for c in 8 0; do MINISGL_DECODE_CLUSTER=$c step "cluster=$c" llama3_8b_graph_step_time_ctx128_gpu; done
echo "end at $(( $(date +%s) - START )) s" >> $S
