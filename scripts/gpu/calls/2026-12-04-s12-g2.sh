#!/bin/bash
# Twelfth session, call 2: the cluster merge through the engine. engine-gpu_graphs
# (graph replay = eager bitwise, the dense fixtures through graphs, every graphed step
# figure), the overlap and fixture tests, gpu_fused (the split merges bit for bit), then
# the Llama-3-8B and Qwen3-30B-A3B graphed steps with the cluster merge off, for the
# same-run comparison.
source .gpu/lib.sh
t 160 graphs $T/engine-gpu_graphs --test-threads=1 --nocapture
grep "SUMMARY" $W/graphs.log | grep -v graph-fixture >> $S
t 80 overlap $T/engine-gpu_overlap --test-threads=1
t 40 fixtures $T/models-gpu_fixtures --test-threads=1
t 100 fused $T/kernel-runtime-gpu_fused --test-threads=1
echo "tests done at $(( $(date +%s) - START )) s" >> $S
MINISGL_DECODE_CLUSTER=0 step "cluster=0" llama3_8b_graph_step_time_ctx128_gpu
MINISGL_DECODE_CLUSTER=0 step "cluster=0" qwen3_30b_a3b_graph_step_time_gpu
echo "end at $(( $(date +%s) - START )) s" >> $S
