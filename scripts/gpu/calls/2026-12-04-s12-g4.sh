#!/bin/bash
# Twelfth session, call 4: the cluster-merging decode block now lets the next kernel launch
# only after its keys are read (call 3: launched at once, the o projection's weight
# prefetch ran beside the attention's loads). The graphed steps and the engine at batch 1
# with the cluster merge (caps 8, 16) and without, then the cold batch-1 attention sweep.
source .gpu/lib.sh
mkdir -p /tmp/l8; cp tests/configs/llama3-8b/config.json /tmp/l8/
for c in 8 16 0; do MINISGL_DECODE_CLUSTER=$c step "cluster=$c" qwen3_0_6b_graph_step_time_gpu; done
for c in 8 0; do MINISGL_DECODE_CLUSTER=$c step "cluster=$c" llama3_8b_graph_step_time_ctx128_gpu; done
for m in q06 l8; do for len in 500 4000; do for c in 8 16 0; do
  MINISGL_DECODE_CLUSTER=$c timeout 60 $BIN/minisgl bench --model /tmp/$m --load-format dummy --device cuda --vocab-size 100000 --num-requests 1 --min-len $len --max-len $len > $W/b1-$m-$len-$c.log 2>&1
  echo "bench b1 $m len=$len cluster=$c rc=$? $(grep -E 'output throughput|^time' $W/b1-$m-$len-$c.log | tr '\n' ' ')" >> $S
done; done; done
( export MINISGL_BENCH_ATTENTION=cold MINISGL_BENCH_ATTENTION_FILTER=decode-b1; timeout 120 $BB/minisgl-attention --bench > $W/bench-attention.log 2>&1; echo "attention rc=$?" >> $S; grep SUMMARY $W/bench-attention.log >> $S )
echo "end at $(( $(date +%s) - START )) s" >> $S
