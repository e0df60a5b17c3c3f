#!/bin/bash
# Eighteenth session, call 4 (bundle with two new switches, both off): the graph
# plan's run-time chunks of at least 64 keys instead of 128
# (MINISGL_DECODE_GRAPH_CHUNK_MIN=64: a 512-key context in 8 one-tile splits, not 4
# two-tile ones) and the MoE decode gate_up pass with two vectors a row in flight
# (MINISGL_MOE_DECODE_UNROLL=2: 80 registers, the 30B's 768 blocks in one wave).
# Their tests, then alternating A/B rounds of the graphed steps.
BUDGET=${BUDGET:-570}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
t 120 moe $T/kernel-runtime-gpu_moe gpu_decode_kernels gpu_fused_router --test-threads=1 --nocapture
t 150 decode $T/kernel-runtime-gpu_decode --test-threads=2
( export MINISGL_DECODE_GRAPH_CHUNK_MIN=64
  t 90 graphs $T/engine-gpu_graphs graph_replay_equals_eager_step dense_fixtures --test-threads=1 )
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
grep -h SUMMARY $W/moe.log >> $S
C64=(MINISGL_DECODE_GRAPH_CHUNK_MIN=64); U2=(MINISGL_MOE_DECODE_UNROLL=2)
for i in 1 2; do
  step_with "r$i default" qwen3_0_6b_graph_step_time_gpu
  step_with "r$i chunk64" qwen3_0_6b_graph_step_time_gpu "${C64[@]}"
done
for i in 1 2; do
  step_with "r$i default" qwen3_30b_a3b_graph_step_time_gpu
  step_with "r$i unroll2" qwen3_30b_a3b_graph_step_time_gpu "${U2[@]}"
  step_with "r$i chunk64" qwen3_30b_a3b_graph_step_time_gpu "${C64[@]}"
done
step_with "r1 default" llama3_8b_graph_step_time_gpu
step_with "r1 chunk64" llama3_8b_graph_step_time_gpu "${C64[@]}"
for v in default chunk64; do
  if [ $v = chunk64 ]; then export MINISGL_DECODE_GRAPH_CHUNK_MIN=64; fi
  timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench-$v.log 2>&1
  echo "bench $v rc=$? $(grep -E 'output throughput' $W/bench-$v.log | tr '\n' ' ')" >> $S
done
unset MINISGL_DECODE_GRAPH_CHUNK_MIN
echo "end at $(( $(date +%s) - START )) s" >> $S
