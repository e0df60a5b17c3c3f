#!/bin/bash
# Sixteenth session, call 1: the three-warp decode block (the thirteenth session's
# exp/decode-3warps, merged behind MINISGL_DECODE_STAGES=1 / MINISGL_DECODE_GRAPH_STAGES=1)
# and the fifteenth session's reworked fused prologue (MINISGL_DECODE_FUSED_ROPE=1), both
# off by default. Their tests (gpu_decode runs stages 1 with the others and the fused
# prologue's bitwise test), then two alternating rounds of the graphed steps and
# `minisgl bench`, default against three warps (and the fused prologue on Qwen3-0.6B),
# then the cold attention bench (its issue-12 and batch-64 cases run stages 2, 3 and 1
# side by side) and the Qwen3-30B-A3B step, as time allows.
BUDGET=${BUDGET:-430}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
t 90 decode $T/kernel-runtime-gpu_decode --test-threads=1 --nocapture
grep -E 'SUMMARY' $W/decode.log | head -20 >> $S
THREE=(MINISGL_DECODE_STAGES=1 MINISGL_DECODE_GRAPH_STAGES=1)
FUSED=(MINISGL_DECODE_FUSED_ROPE=1)
vars() { v=(); [ $1 = three ] && v=("${THREE[@]}"); [ $1 = fused ] && v=("${FUSED[@]}"); }
bench() { [ $(left) -lt 50 ] && return; vars $2
  env "${v[@]}" timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench-$1-$2.log 2>&1
  echo "$1 $2 bench rc=$? $(grep -E 'output throughput|^time' $W/bench-$1-$2.log | tr '\n' ' ')" >> $S; }
# The kernel timeline of the Qwen3-0.6B graphed step (scripts/gpu/kernel_timeline.c:
# CUPTI's concurrent-kernel records through the driver's injection hook), then the
# per-kernel links of its most replayed graph (scripts/gpu/timeline_table.py).
if [ -e .gpu/libkernel_timeline.so ] && [ $(left) -gt 120 ]; then
  CUDA_INJECTION64_PATH=$ROOT/.gpu/libkernel_timeline.so MINISGL_TIMELINE=$W/timeline-q06.csv timeout 90 \
    $T/engine-gpu_graphs qwen3_0_6b_graph_step_time_gpu --test-threads=1 --nocapture > $W/timeline-q06.log 2>&1
  echo "timeline rc=$? $(grep -E 'kernel_timeline|SUMMARY graph-step' $W/timeline-q06.log | tr '\n' ' ')" >> $S
  python3 scripts/gpu/timeline_table.py $W/timeline-q06.csv --label q06 > $W/timeline-q06.txt 2>&1
  grep -E "graphs:|graph [0-9]+:|by name" $W/timeline-q06.txt | head -30 >> $S
  gzip -f $W/timeline-q06.csv
fi
for w in default three fused; do vars $w; step_with "r1 $w" qwen3_0_6b_graph_step_time_gpu "${v[@]}"; done
for w in default three; do vars $w; step_with "r1 $w" llama3_8b_graph_step_time_ctx128_gpu "${v[@]}"; done
bench r1 default; bench r1 three
echo "round 1 done at $(( $(date +%s) - START )) s" >> $S
for w in three default; do vars $w; step_with "r2 $w" llama3_8b_graph_step_time_ctx128_gpu "${v[@]}"; done
for w in fused three default; do vars $w; step_with "r2 $w" qwen3_0_6b_graph_step_time_gpu "${v[@]}"; done
bench r2 three; bench r2 default
echo "round 2 done at $(( $(date +%s) - START )) s" >> $S
if [ $(left) -gt 80 ]; then
  MINISGL_BENCH_ATTENTION=cold timeout $(( $(left) - 10 )) $BB/minisgl-attention --bench > $W/bench-attention.log 2>&1
  echo "attention rc=$?" >> $S; grep SUMMARY $W/bench-attention.log | grep -v "decode-b1" | sed "s/ (.*bytes per launch)//" >> $S
fi
echo "end at $(( $(date +%s) - START )) s" >> $S
