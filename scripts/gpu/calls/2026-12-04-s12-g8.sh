#!/bin/bash
# Twelfth session, call 8 (the bundle of call 5): why the cluster-merging decode kernel takes
# 12.9 us alone in the Qwen3-0.6B bs=1 step (call 7; the combine pair 6.5 + 2.3 us): ncu's
# launch, occupancy, scheduler and warp-state sections of a few launches of each.
source .gpu/lib.sh
S2="--section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis --clock-control none --cache-control none"
for c in 8 0; do
  MINISGL_DECODE_CLUSTER=$c timeout 150 ncu $S2 --kernel-name regex:decode_attention --launch-skip 440 --launch-count 4 \
    $T/engine-gpu_graphs qwen3_0_6b_graph_step_time_gpu --test-threads=1 > $OUT/ncu-sections-c$c.txt 2>&1
  echo "ncu cluster=$c rc=$?" >> $S
done
echo "end at $(( $(date +%s) - START )) s" >> $S
