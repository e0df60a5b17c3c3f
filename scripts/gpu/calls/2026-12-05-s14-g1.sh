#!/bin/bash
# Fourteenth session, call 1 (prepared, not run: no machine was lent in the session): the
# layer's rope_store fused into the tensor-core decode launch (MINISGL_DECODE_FUSED_ROPE=1,
# off by default until this call measures it).
#  1. Tests: the fused prologue against rope_store + attention bit for bit (kernel-runtime
#     gpu_decode), the decode kernel's own tests, and engine-gpu_graphs with the fusion on
#     (replay = eager bitwise at 1, 7, 64, 256; the dense fixtures through graphs) beside
#     models gpu_fixtures with it on; and the structured-output engine test on the GPU
#     (minisgl-engine_structured gpu_: in the bundle since this session, never run there).
#  2. Two alternating rounds of the Qwen3-0.6B graphed step (bs=1 <= 0.8 ms is the target
#     closest) with the fusion and the in-launch split merge (MINISGL_DECODE_SPLIT_MERGE=1,
#     which saves the combine launch, another link of a bs=1 layer's chain) off and on,
#     alone and together; `minisgl bench` plain, fused and both; the Llama-3-8B ctx-128
#     step plain and fused.
BUDGET=${BUDGET:-570}
source .gpu/lib.sh
( t 150 decode $T/kernel-runtime-gpu_decode fused rope_store --test-threads=1 --nocapture; t 100 structured $T/minisgl-engine_structured gpu_ --test-threads=1 ) &
( export MINISGL_DECODE_FUSED_ROPE=1; t 150 graphs $T/engine-gpu_graphs --test-threads=1 --skip step_time; t 90 fixtures $T/models-gpu_fixtures --test-threads=2 ) &
wait
grep 'SUMMARY decode fused' $W/decode.log >> $S
echo "tests done at $(( $(date +%s) - START )) s" >> $S
bench() { local label=$1; shift
  [ $(left) -lt 40 ] && { echo "bench $label skipped" >> $S; return; }
  env "$@" timeout 40 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench-$label.log 2>&1
  echo "bench $label rc=$? $(grep -E 'output throughput' $W/bench-$label.log | tr '\n' ' ')" >> $S; }
F=MINISGL_DECODE_FUSED_ROPE=1; M=MINISGL_DECODE_SPLIT_MERGE=1
for i in 1 2; do
  step_with "r$i plain" qwen3_0_6b_graph_step_time_gpu
  step_with "r$i fused" qwen3_0_6b_graph_step_time_gpu $F
  step_with "r$i merge" qwen3_0_6b_graph_step_time_gpu $M
  step_with "r$i fused+merge" qwen3_0_6b_graph_step_time_gpu $F $M
done
bench plain; bench fused $F; bench fused+merge $F $M
step_with "plain" llama3_8b_graph_step_time_ctx128_gpu
step_with "fused" llama3_8b_graph_step_time_ctx128_gpu $F
echo "end at $(( $(date +%s) - START )) s" >> $S
