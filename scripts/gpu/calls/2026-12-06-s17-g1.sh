#!/bin/bash
# Seventeenth session, call 1: the sixteenth session's prepared call 3 with the full
# budget. MINISGL_PDL_LAUNCH_FIRST=1 (rope_store and the split combine let their
# successor launch before their own wait; device.cuh grid_prologue_launch_first):
# correctness under the switch (replay = eager bit for bit, the dense fixtures through
# graphs, the keys rope_store wrote, overlapped decoding = plain), then alternating
# rounds of the graphed steps (Qwen3-0.6B, Llama-3-8B ctx 128, Qwen3-30B-A3B) and
# `minisgl bench`, then the switch's kernel timeline.
BUDGET=${BUDGET:-550}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
LF=(MINISGL_PDL_LAUNCH_FIRST=1)
( export MINISGL_PDL_LAUNCH_FIRST=1
  t 70 graphs $T/engine-gpu_graphs graph_replay_equals_eager_step dense_fixtures --test-threads=1
  t 40 decode $T/kernel-runtime-gpu_decode reads_the_keys --test-threads=1
  t 60 overlap $T/engine-gpu_overlap --test-threads=1 )
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
bench() { [ $(left) -lt 50 ] && return; local v=(); [ $2 = first ] && v=("${LF[@]}")
  env "${v[@]}" timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench-$1-$2.log 2>&1
  echo "$1 $2 bench rc=$? $(grep -E 'output throughput|^time' $W/bench-$1-$2.log | tr '\n' ' ')" >> $S; }
for i in 1 2; do
  step_with "r$i default" qwen3_0_6b_graph_step_time_gpu
  step_with "r$i first" qwen3_0_6b_graph_step_time_gpu "${LF[@]}"
done
step_with "r1 first" llama3_8b_graph_step_time_ctx128_gpu "${LF[@]}"
step_with "r1 default" llama3_8b_graph_step_time_ctx128_gpu
bench r1 first; bench r1 default
echo "round 1 done at $(( $(date +%s) - START )) s" >> $S
step_with "r1 default" qwen3_30b_a3b_graph_step_time_gpu
step_with "r1 first" qwen3_30b_a3b_graph_step_time_gpu "${LF[@]}"
step_with "r2 default" llama3_8b_graph_step_time_ctx128_gpu
step_with "r2 first" llama3_8b_graph_step_time_ctx128_gpu "${LF[@]}"
bench r2 default; bench r2 first
if [ -e .gpu/libkernel_timeline.so ] && [ $(left) -gt 50 ]; then
  MINISGL_PDL_LAUNCH_FIRST=1 CUDA_INJECTION64_PATH=$ROOT/.gpu/libkernel_timeline.so MINISGL_TIMELINE=$W/timeline-first.csv \
    timeout 45 $T/engine-gpu_graphs qwen3_0_6b_graph_step_time_gpu --test-threads=1 --nocapture > $W/timeline-first.log 2>&1
  echo "timeline rc=$? $(grep -E 'SUMMARY graph-step' $W/timeline-first.log | tr '\n' ' ')" >> $S; gzip -f $W/timeline-first.csv
fi
echo "end at $(( $(date +%s) - START )) s" >> $S
