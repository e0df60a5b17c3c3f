#!/bin/bash
# Thirteenth session, call 1: the tensor-core decode block's half-tile ring (four
# blocks an SM at head dim 128 and 2 stages, three before): the decode kernel's tests,
# the cold graph-timed attention bench (issue 12's shapes at 2 and 3 stages, a batch-64
# short-context graph step, batch 1 over contexts), the engine's graph tests and step
# figures, and `minisgl bench`.
BUDGET=${BUDGET:-560}
source .gpu/lib.sh
t 150 decode $T/kernel-runtime-gpu_decode --test-threads=1
( export MINISGL_BENCH_ATTENTION=cold; timeout 140 $BB/minisgl-attention --bench > $W/bench-attention.log 2>&1; echo "attention rc=$?" >> $S; grep SUMMARY $W/bench-attention.log >> $S )
echo "attention done at $(( $(date +%s) - START )) s" >> $S
timeout 40 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench.log 2>&1
echo "bench rc=$? $(grep -E 'output throughput|^time' $W/bench.log | tr '\n' ' ')" >> $S
grep -E '^  (decode|prefill)' $W/bench.log >> $S
t 170 graphs $T/engine-gpu_graphs --test-threads=1 --nocapture
grep "SUMMARY graph-step" $W/graphs.log >> $S
echo "end at $(( $(date +%s) - START )) s" >> $S
