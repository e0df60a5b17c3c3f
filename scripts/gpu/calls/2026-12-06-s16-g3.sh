#!/bin/bash
# Sixteenth session, call 3: the small kernels that let their successor launch first
# (MINISGL_PDL_LAUNCH_FIRST=1: rope_store before decode attention, the split combine
# before the o projection; device.cuh: grid_prologue_launch_first). Call 1's timeline
# showed the o projection after the combine taking 6.6 us of a Qwen3-0.6B bs=1 layer for
# 4 MiB (its blocks became resident only once the attention launch ended) and the
# attention launch 6.5-8.7 us. Correctness under the switch first (replay = eager bit
# for bit, the dense fixtures through graphs, the keys rope_store wrote, overlapped
# decoding = plain), then alternating rounds of the graphed steps, then its timeline.
# Before it: `cargo xtask gpu-bundle`, `scripts/gpu/build_timeline.sh`, and copying
# lib.sh and this script into .gpu/. (Prepared; refused this session for lack of device
# time. With a full budget, raise BUDGET and add the 30B step.)
BUDGET=${BUDGET:-270}
source .gpu/lib.sh
nvidia-smi --query-gpu=name --format=csv,noheader >> $S
LF=(MINISGL_PDL_LAUNCH_FIRST=1)
( export MINISGL_PDL_LAUNCH_FIRST=1
  t 70 graphs $T/engine-gpu_graphs graph_replay_equals_eager_step_gpu dense_fixtures --test-threads=1
  t 40 decode $T/kernel-runtime-gpu_decode reads_the_keys --test-threads=1
  t 60 overlap $T/engine-gpu_overlap --test-threads=1 )
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
for i in 1 2; do
  step_with "r$i default" qwen3_0_6b_graph_step_time_gpu
  step_with "r$i first" qwen3_0_6b_graph_step_time_gpu "${LF[@]}"
done
step_with "r1 first" llama3_8b_graph_step_time_ctx128_gpu "${LF[@]}"
step_with "r1 default" llama3_8b_graph_step_time_ctx128_gpu
if [ -e .gpu/libkernel_timeline.so ] && [ $(left) -gt 50 ]; then
  MINISGL_PDL_LAUNCH_FIRST=1 CUDA_INJECTION64_PATH=$ROOT/.gpu/libkernel_timeline.so MINISGL_TIMELINE=$W/timeline-first.csv \
    timeout 45 $T/engine-gpu_graphs qwen3_0_6b_graph_step_time_gpu --test-threads=1 --nocapture > $W/timeline-first.log 2>&1
  echo "timeline rc=$?" >> $S; gzip -f $W/timeline-first.csv
fi
echo "end at $(( $(date +%s) - START )) s" >> $S
