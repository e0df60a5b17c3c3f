#!/bin/bash
# Nineteenth session, prepared and not run (no device time left): ncu of the
# warp-specialised prefill tile 22 beside tile 17 at 32/8 b=1 L=4096 (speed of light,
# warp states, scheduler, occupancy), the profile docs/PERF.md asks for next.
BUDGET=${BUDGET:-110}
source .gpu/lib.sh
A="--bench --warm-up-time 0.05 --measurement-time 0.05"
SEC="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats"
for tile in 22 17; do
  [ $(left) -lt 25 ] && break
  MINISGL_BENCH_PREFILL_TILES=$tile timeout $(( $(left) - 8 )) ncu --clock-control none $SEC --kernel-name regex:prefill_attention --launch-skip 3 --launch-count 1 \
    $BB/minisgl-attention "prefill-new tile=$tile 32/8 b=1 L=4096" $A > $W/ncu-$tile.log 2>&1
  echo "ncu tile $tile rc=$?" >> $S
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Stall|One or More" $W/ncu-$tile.log | head -24 >> $S
done
