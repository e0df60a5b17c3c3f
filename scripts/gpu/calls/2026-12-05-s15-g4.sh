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
SECS="--section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis --section SourceCounters --section InstructionStats"
prof() { local name=$1; shift; [ $(left) -lt 50 ] && { echo "ncu $name skipped" >> $S; return; }
  env "$@" timeout 60 ncu --clock-control none $SECS --kernel-name regex:decode_attention_kernel \
    --launch-skip 300 --launch-count 2 -o $W/$name $T/engine-gpu_graphs qwen3_0_6b_graph_step_time_gpu --test-threads=1 > $W/ncu-$name.log 2>&1
  echo "ncu $name rc=$?" >> $S
  ncu -i $W/$name.ncu-rep --print-details all > $W/$name-details.txt 2>&1
  ncu -i $W/$name.ncu-rep --page source --csv --print-source sass > $W/$name-sass.csv 2>&1
  grep -E "decode_attention_kernel|Duration|Registers Per|Grid Size" $W/$name-details.txt | head -12 >> $S
}
F=MINISGL_DECODE_FUSED_ROPE=1
for i in 1 2; do
  step_with "r$i plain" qwen3_0_6b_graph_step_time_gpu
  step_with "r$i fused" qwen3_0_6b_graph_step_time_gpu $F
done
prof fused MINISGL_DECODE_FUSED_ROPE=1
prof plain
echo "ncu done at $(( $(date +%s) - START )) s" >> $S
echo "end at $(( $(date +%s) - START )) s" >> $S
