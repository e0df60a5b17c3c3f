#!/bin/bash
# Sixteenth session, call 1: the three-warp decode block (the thirteenth session's
# exp/decode-3warps, merged behind MINISGL_DECODE_STAGES=1 / MINISGL_DECODE_GRAPH_STAGES=1)
# and the fifteenth session's reworked fused prologue (MINISGL_DECODE_FUSED_ROPE=1), both
# off by default. Their tests (gpu_decode runs stages 1 with the others and the fused
# prologue's bitwise test), the cold attention bench default against three warps, then
# round 1 of the graphed steps and `minisgl bench` (call 2 runs round 2 in reverse order).
BUDGET=${BUDGET:-575}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
t 150 decode $T/kernel-runtime-gpu_decode --test-threads=1 --nocapture
grep -E 'SUMMARY' $W/decode.log | head -20 >> $S
THREE=(MINISGL_DECODE_STAGES=1 MINISGL_DECODE_GRAPH_STAGES=1)
FUSED=(MINISGL_DECODE_FUSED_ROPE=1)
for w in default three; do
  v=(); [ $w = three ] && v=("${THREE[@]}")
  env "${v[@]}" MINISGL_BENCH_ATTENTION=cold timeout 75 $BB/minisgl-attention --bench > $W/bench-attention-$w.log 2>&1
  echo "attention $w rc=$?" >> $S; grep SUMMARY $W/bench-attention-$w.log | sed "s/ (.*bytes per launch)//; s/^/$w /" >> $S
done
echo "benches done at $(( $(date +%s) - START )) s" >> $S
for w in default three fused; do
  v=(); [ $w = three ] && v=("${THREE[@]}"); [ $w = fused ] && v=("${FUSED[@]}")
  step_with "r1 $w" qwen3_0_6b_graph_step_time_gpu "${v[@]}"
done
for w in default three; do
  v=(); [ $w = three ] && v=("${THREE[@]}")
  step_with "r1 $w" llama3_8b_graph_step_time_ctx128_gpu "${v[@]}"
done
for w in default three; do
  [ $(left) -lt 50 ] && break
  v=(); [ $w = three ] && v=("${THREE[@]}")
  env "${v[@]}" timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench-$w.log 2>&1
  echo "r1 $w bench rc=$? $(grep -E 'output throughput|^time' $W/bench-$w.log | tr '\n' ' ')" >> $S
done
echo "end at $(( $(date +%s) - START )) s" >> $S
