#!/bin/bash
# Twelfth session, call 7 (the bundle of call 5): the decode attention kernels of the graphed
# Qwen3-0.6B bs=1 step under ncu (each kernel alone, caches not flushed), cluster merge cap 8
# against the combine launch: is the cluster kernel itself slower in the step, or only its
# overlap with its neighbours?
source .gpu/lib.sh
which nsys ncu >> $S 2>&1
M="--metrics gpu__time_duration.sum --csv --clock-control none --cache-control none"
for c in 8 0; do
  MINISGL_DECODE_CLUSTER=$c timeout 120 ncu $M --kernel-name regex:decode_attention --launch-skip 400 --launch-count 60 \
    $T/engine-gpu_graphs qwen3_0_6b_graph_step_time_gpu --test-threads=1 > $W/ncu-c$c.csv 2>&1
  echo "ncu cluster=$c rc=$?" >> $S; cp $W/ncu-c$c.csv $OUT/
  grep -E '"gpu__time_duration.sum"' $W/ncu-c$c.csv | awk -F'","' '{print $5, $(NF)}' | sort | uniq -c | sort -rn | head -8 >> $S
done
echo "end at $(( $(date +%s) - START )) s" >> $S
