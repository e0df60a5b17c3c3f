#!/bin/bash
# Fifteenth session, call 3: (1) ncu's detail and per-instruction stall samples of the
# fused-prologue decode kernel and of the plain one (call 2: 17.1 us alone against 6.5 us
# + rope_store 4.5 us), reports kept in the logs; (2) the fused prologue launched without
# programmatic dependent launch (MINISGL_DECODE_FUSED_PDL=0) beside plain and fused, two
# alternating rounds of the Qwen3-0.6B step; (3) this session's new defaults on
# Qwen3-30B-A3B (the fused router on, the pre-norm skinny window to 24 MiB) against the
# old ones (MINISGL_MOE_FUSED_ROUTER=0 MINISGL_SKINNY_WEIGHT_MIB=1,16), two rounds, and
# `minisgl bench` on both configs; tests of what the defaults reach.
BUDGET=${BUDGET:-560}
source .gpu/lib.sh
SECS="--section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis --section SourceCounters"
prof() { local name=$1 regex=$2 count=$3; shift 3
  env "$@" timeout 100 ncu --clock-control none $SECS --kernel-name-base demangled --kernel-name regex:"$regex" \
    --launch-skip 300 --launch-count $count -o $W/$name $T/engine-gpu_graphs qwen3_0_6b_graph_step_time_gpu --test-threads=1 > $W/ncu-$name.log 2>&1
  echo "ncu $name rc=$?" >> $S
  ncu -i $W/$name.ncu-rep --print-details all > $W/$name-details.txt 2>&1
  ncu -i $W/$name.ncu-rep --page source --csv --print-source sass > $W/$name-sass.csv 2>&1
  grep -E "Duration|Registers Per|Grid Size" $W/$name-details.txt | head -6 >> $S
}
prof fused 'decode_attention_kernel<2, 128, 16, 2, 0, 1>' 1 MINISGL_DECODE_FUSED_ROPE=1
prof plain 'decode_attention_kernel<2, 128, 16, 2, 0, 0>' 2
echo "ncu done at $(( $(date +%s) - START )) s" >> $S
( t 120 moegraphs $T/engine-gpu_graphs qwen3_moe --test-threads=1; t 100 moefix $T/models-moe_fixtures gpu_bf16 --test-threads=1 ) &
( t 150 fused $T/kernel-runtime-gpu_fused --test-threads=2 ) &
wait
echo "tests done at $(( $(date +%s) - START )) s" >> $S
F=MINISGL_DECODE_FUSED_ROPE=1; P=MINISGL_DECODE_FUSED_PDL=0; OLD="MINISGL_MOE_FUSED_ROUTER=0 MINISGL_SKINNY_WEIGHT_MIB=1,16"
for i in 1 2; do
  step_with "r$i plain" qwen3_0_6b_graph_step_time_gpu
  step_with "r$i fused" qwen3_0_6b_graph_step_time_gpu $F
  step_with "r$i fused-nopdl" qwen3_0_6b_graph_step_time_gpu $F $P
  step_with "r$i 30b-new" qwen3_30b_a3b_graph_step_time_gpu
  step_with "r$i 30b-old" qwen3_30b_a3b_graph_step_time_gpu $OLD
done
bench() { local label=$1 model=$2; shift 2
  [ $(left) -lt 60 ] && { echo "bench $label skipped" >> $S; return; }
  env "$@" timeout 90 $BIN/minisgl bench --model $model --load-format dummy --device cuda --vocab-size 151643 > $W/bench-$label.log 2>&1
  echo "bench $label rc=$? $(grep -E 'output throughput|^time' $W/bench-$label.log | tr '\n' ' ')" >> $S; grep -E "^  (decode|prefill)" $W/bench-$label.log >> $S; }
mkdir -p /tmp/q30; cp tests/configs/qwen3-30b-a3b/config.json /tmp/q30/; cp tests/fixtures/qwen3-tiny/tokenizer* /tmp/q30/
bench q06 /tmp/q06
bench q30 /tmp/q30
echo "end at $(( $(date +%s) - START )) s" >> $S
