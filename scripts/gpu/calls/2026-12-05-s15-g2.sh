#!/bin/bash
# Fifteenth session, call 2 (H100): the fourteenth session's MoE call (2026-12-05-s14-g2.sh,
# run as it is), then why the fused rope prologue made the Qwen3-0.6B bs=1 graphed step
# slower in call 1 (0.963 -> 1.090 ms): ncu's duration, registers and occupancy of the
# decode launches (and rope_store's) with and without the fusion, each launch alone
# (ncu serialises them, so what the programmatic launch overlaps is not in these).
BUDGET=${BUDGET:-450} bash .gpu/2026-12-05-s14-g2.sh
cp $OUT/summary.txt /tmp/s14g2.txt; mv $OUT/logs.tgz /tmp/s14g2-logs.tgz 2>/dev/null
BUDGET=120
source .gpu/lib.sh
cat /tmp/s14g2.txt > $S
M="gpu__time_duration.sum,launch__registers_per_thread,launch__grid_size,launch__occupancy_limit_shared_mem,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed"
for f in 0 1; do
  MINISGL_DECODE_FUSED_ROPE=$f timeout 55 ncu --clock-control none --csv --metrics $M --kernel-name regex:'decode_attention|rope_store' \
    --launch-skip 600 --launch-count 16 $T/engine-gpu_graphs qwen3_0_6b_graph_step_time_gpu --test-threads=1 > $W/ncu-f$f.csv 2>&1
  echo "ncu fused=$f rc=$?" >> $S
  grep -E '^"[0-9]' $W/ncu-f$f.csv | awk -F'","' '{k=$5; sub(/\(.*/,"",k); key=k " | " $(NF-2); v=$(NF); gsub(/[",]/,"",v); s[key]+=v; c[key]++} END {for (x in s) printf "%s = %.2f (n=%d)\n", x, s[x]/c[x], c[x]}' | sort >> $S
done
echo "end at $(( $(date +%s) - START )) s" >> $S
