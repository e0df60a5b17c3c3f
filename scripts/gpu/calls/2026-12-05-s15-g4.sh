#!/bin/bash
# Fifteenth session, call 4: the fused prologue reworked (one pass over the work rows: the
# query rows, then the new keys' k and v rows; the zero rows of q and the L1 prefetch of
# each row's position, out_loc, cos / sin and norm weights before the grid dependency
# wait). Its bitwise test; then ncu's detail and per-instruction stall samples of it and
# of the plain kernel (call 3's filter named the template arguments as `2, 128` where ncu
# writes `(int)2, (int)128`, and matched nothing); then two alternating rounds of the
# Qwen3-0.6B graphed step plain and fused (first: ncu after them, as time allows).
BUDGET=${BUDGET:-170}
source .gpu/lib.sh
t 60 decode $T/kernel-runtime-gpu_decode fused --test-threads=1 --nocapture
grep 'SUMMARY decode fused' $W/decode.log >> $S
F=MINISGL_DECODE_FUSED_ROPE=1
for i in 1 2; do
  step_with "r$i plain" qwen3_0_6b_graph_step_time_gpu
  step_with "r$i fused" qwen3_0_6b_graph_step_time_gpu $F
done
ncu_decode fused MINISGL_DECODE_FUSED_ROPE=1
ncu_decode plain
echo "ncu done at $(( $(date +%s) - START )) s" >> $S
echo "end at $(( $(date +%s) - START )) s" >> $S
