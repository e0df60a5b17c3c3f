#!/bin/bash
# Twelfth session, call 1: the cluster merge of split decode (the splits of a (sequence,
# kv head) as one thread-block cluster, merged through distributed shared memory; no
# combine launch). The decode kernel's tests (cluster = combine bit for bit), the cold
# graph-timed attention bench (batch 1 over contexts: cluster on/off, graph plan depths),
# then `minisgl bench` and the Qwen3-0.6B graphed step with the cluster merge on and off.
source .gpu/lib.sh
t 170 decode $T/kernel-runtime-gpu_decode --test-threads=1
( export MINISGL_BENCH_ATTENTION=cold; timeout 160 $BB/minisgl-attention --bench > $W/bench-attention.log 2>&1; echo "attention rc=$?" >> $S; grep SUMMARY $W/bench-attention.log >> $S )
echo "attention done at $(( $(date +%s) - START )) s" >> $S
for c in 16 0; do
  ( export MINISGL_DECODE_CLUSTER=$c
    timeout 40 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench-c$c.log 2>&1
    echo "bench cluster=$c rc=$? $(grep -E 'output throughput|^time' $W/bench-c$c.log | tr '\n' ' ')" >> $S
    step cluster=$c qwen3_0_6b_graph_step_time_gpu )
done
echo "end at $(( $(date +%s) - START )) s" >> $S
