#!/bin/bash
# Thirteenth session, call 5 (branch exp/decode-3warps; prepared, not run: no machine was
# lent): the three-warp decode block (MINISGL_DECODE_STAGES=1, MINISGL_DECODE_GRAPH_STAGES=1:
# 2 stages, 96 threads, four blocks an SM at head dim 128). Its tests (gpu_decode runs
# stages 1 with the others), the cold bench (issue 12's shapes at stages 1, 2 and 3, the
# batch-64 short-context graph step at each; batch 1 with the default and with stages 1),
# then alternating rounds of the graphed steps and `minisgl bench`, default against 3 warps.
BUDGET=${BUDGET:-570}
source .gpu/lib.sh
t 150 decode $T/kernel-runtime-gpu_decode --test-threads=1
for w in default three; do
  [ $w = three ] && export MINISGL_DECODE_STAGES=1 MINISGL_DECODE_GRAPH_STAGES=1
  ( export MINISGL_BENCH_ATTENTION=cold; timeout 70 $BB/minisgl-attention --bench > $W/bench-attention-$w.log 2>&1
    echo "attention $w rc=$?" >> $S; grep SUMMARY $W/bench-attention-$w.log | sed "s/ (.*bytes per launch)//; s/^/$w /" >> $S )
  unset MINISGL_DECODE_STAGES MINISGL_DECODE_GRAPH_STAGES
done
for i in 1 2; do
  for w in default three; do
    [ $(left) -lt 60 ] && break 2
    v=(); [ $w = three ] && v=(MINISGL_DECODE_STAGES=1 MINISGL_DECODE_GRAPH_STAGES=1)
    for x in qwen3_0_6b_graph_step_time_gpu llama3_8b_graph_step_time_ctx128_gpu; do step_with "r$i $w" $x "${v[@]}"; done
    env "${v[@]}" timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench-$w-$i.log 2>&1
    echo "r$i $w bench rc=$? $(grep -E 'output throughput|^time' $W/bench-$w-$i.log | tr '\n' ' ')" >> $S
  done
done
echo "end at $(( $(date +%s) - START )) s" >> $S
