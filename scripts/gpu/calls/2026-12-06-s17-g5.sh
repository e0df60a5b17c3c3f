#!/bin/bash
# Seventeenth session, call 5 (prepared, not run: the session's device time was spent).
# For an H200 (the targets' card): the headline figures under the bulk prefetch
# default (Qwen3-0.6B bs=1 against the 0.8 ms target, Llama-3-8B bs=1 / bs=64, the
# bench), then the prepared MINISGL_SKINNY_BULK_WIDE=1 (the 30B's o_proj by the copy
# engine, one block an SM) with its tests and A/B rounds of the 30B step, with and
# without launch-first (call 1: -2% on one round), and the 30B's timeline.
BUDGET=${BUDGET:-540}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
( export MINISGL_SKINNY_BULK_WIDE=1
  t 120 bulk $T/kernel-runtime-gpu_fused skinny_bulk --test-threads=1
  t 60 graphs $T/engine-gpu_graphs graph_replay_equals_eager_step --test-threads=1 )
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
for i in 1 2; do
  step_with "r$i default" qwen3_0_6b_graph_step_time_gpu
  step_with "r$i cp.async" qwen3_0_6b_graph_step_time_gpu MINISGL_SKINNY_BULK=0
done
step_with "r1 default" llama3_8b_graph_step_time_gpu
timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench.log 2>&1
echo "bench rc=$? $(grep -E 'output throughput|^time' $W/bench.log | tr '\n' ' ')" >> $S
WIDE=(MINISGL_SKINNY_BULK_WIDE=1); WLF=(MINISGL_SKINNY_BULK_WIDE=1 MINISGL_PDL_LAUNCH_FIRST=1)
vars() { v=(); case $1 in wide) v=("${WIDE[@]}");; widelf) v=("${WLF[@]}");; esac; }
for i in 1 2; do
  for w in default wide widelf; do vars $w; step_with "r$i $w" qwen3_30b_a3b_graph_step_time_gpu "${v[@]}"; done
done
if [ $(left) -gt 60 ]; then
  MINISGL_SKINNY_BULK_WIDE=1 CUDA_INJECTION64_PATH=$ROOT/.gpu/libkernel_timeline.so MINISGL_TIMELINE=$W/tl-30b.csv \
    timeout 60 $T/engine-gpu_graphs qwen3_30b_a3b_graph_step_time_gpu --test-threads=1 --nocapture > $W/tl-30b.log 2>&1
  echo "timeline rc=$?" >> $S
  python3 scripts/gpu/timeline_table.py $W/tl-30b.csv --graph 32 --layer 9,2 2>&1 | grep -E "graph 32:|layer" >> $S
  gzip -f $W/tl-30b.csv
fi
echo "end at $(( $(date +%s) - START )) s" >> $S
