#!/bin/bash
# Seventeenth session, call 4: the bulk prefetch on by default, after call 3's racecheck
# found the gated kernel's race (its epilogue read another warp's up sum with no
# barrier; fixed). The sanitizers over the bulk tests and the gated kernel's tests,
# the skinny GEMM tests, graph replay = eager and the fixtures through graphs,
# overlapped = plain, the dense fixtures, then alternating rounds of the graphed steps
# (default against MINISGL_SKINNY_BULK=0) and the bench, as far as the time goes.
BUDGET=${BUDGET:-420}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
for tool in racecheck memcheck; do
  t 90 san-$tool compute-sanitizer --tool $tool --error-exitcode 9 $T/kernel-runtime-gpu_fused skinny_bulk linear_silu_mul --test-threads=1
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Error:|Race reported" $W/san-$tool.log | head -6 >> $W/t-san-$tool.sum
done
t 150 fused $T/kernel-runtime-gpu_fused --test-threads=2
t 60 graphs $T/engine-gpu_graphs graph_replay_equals_eager_step dense_fixtures --test-threads=1
t 60 overlap $T/engine-gpu_overlap --test-threads=1
t 40 fixtures $T/models-gpu_fixtures --test-threads=1
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
for i in 1 2; do
  step_with "r$i default" qwen3_0_6b_graph_step_time_gpu
  step_with "r$i cp.async" qwen3_0_6b_graph_step_time_gpu MINISGL_SKINNY_BULK=0
done
for w in 1 0; do
  [ $(left) -lt 30 ] && break
  MINISGL_SKINNY_BULK=$w timeout 25 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench-$w.log 2>&1
  echo "bulk=$w bench rc=$? $(grep -E 'output throughput' $W/bench-$w.log)" >> $S
done
echo "end at $(( $(date +%s) - START )) s" >> $S
