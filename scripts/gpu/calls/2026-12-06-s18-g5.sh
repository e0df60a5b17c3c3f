#!/bin/bash
# Eighteenth session, call 5 (bundle with the graph plan's 64-key chunk minimum on by
# default): the GPU suites that the new defaults reach, then A/B rounds against the
# old minimum (MINISGL_DECODE_GRAPH_CHUNK_MIN=128) and, now that a short context has
# twice the splits, the in-launch split merge and launch-first once more; the
# headline figures for the record.
BUDGET=${BUDGET:-540}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
t 90 graphs $T/engine-gpu_graphs graph_replay dense_fixtures --test-threads=1
t 90 overlap $T/engine-gpu_overlap --test-threads=1
t 120 fixtures $T/models-gpu_fixtures --test-threads=1
t 60 moefix $T/models-moe_fixtures gpu_bf16 --test-threads=1
t 90 fused $T/kernel-runtime-gpu_fused --test-threads=1
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
for i in 1 2; do
  step_with "r$i default" qwen3_0_6b_graph_step_time_gpu
  step_with "r$i chunk128" qwen3_0_6b_graph_step_time_gpu MINISGL_DECODE_GRAPH_CHUNK_MIN=128
done
step_with "merge" qwen3_0_6b_graph_step_time_gpu MINISGL_DECODE_SPLIT_MERGE=1
step_with "launch-first" qwen3_0_6b_graph_step_time_gpu MINISGL_PDL_LAUNCH_FIRST=1
step_with "r1 default" qwen3_30b_a3b_graph_step_time_gpu
step_with "r1 default" llama3_8b_graph_step_time_ctx128_gpu
timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench.log 2>&1
echo "bench rc=$? $(grep -E 'output throughput' $W/bench.log | tr '\n' ' ')" >> $S
echo "end at $(( $(date +%s) - START )) s" >> $S
