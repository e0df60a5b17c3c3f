#!/bin/bash
# Twenty-fifth session, call L: Q by TMA (q_map) against Q by cp.async
# (PROBE_Q_CPASYNC=1, the same binaries) in tiles 39 and 46 at the bench shapes, and
# tails and GQA 1..4 against the naive kernel.
START=$(date +%s)
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
trap 'cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
tar xJf .gpu/probe.tar.xz -C .gpu
P=.gpu/probe/prefill_probe_qt_T
CASES="32 8 1 4096 16 32 8 8 1024 16 16 8 1 4096 16 32 8 16 512 16 32 8 3 1000 16 16 8 5 777 16 8 8 2 1000 16 24 8 2 900 16"
for t in 39 46; do
  for mode in tma cpasync; do
    if [ $mode = cpasync ]; then export PROBE_Q_CPASYNC=1; else unset PROBE_Q_CPASYNC; fi
    timeout 40 $P$t $CASES > $W/$t-$mode.log 2>&1; echo "T$t Q by $mode rc=$? ($(( $(date +%s) - START )) s)" >> $S
    grep -E "^(SUMMARY|TIMELINE producer|TIMELINE tile)" $W/$t-$mode.log >> $S
  done
done
