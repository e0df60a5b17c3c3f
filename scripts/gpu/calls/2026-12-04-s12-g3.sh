#!/bin/bash
# Twelfth session, call 3: is the cluster merge's loss in the graphed bs=1 step (call 2) GPU
# time or the graph's launch? The step figures now add the replay behind a backlog of
# copies (the launch hidden, as in the engine's overlapped steps); then the engine itself
# at batch 1 (`minisgl bench --num-requests 1`, overlap and graphs on) at 500 and 4000
# tokens in and out, cluster merge (cap 8) on and off.
source .gpu/lib.sh
mkdir -p /tmp/l8; cp tests/configs/llama3-8b/config.json /tmp/l8/
for c in 8 16 0; do MINISGL_DECODE_CLUSTER=$c step "cluster=$c" qwen3_0_6b_graph_step_time_gpu; done
for c in 8 0; do MINISGL_DECODE_CLUSTER=$c step "cluster=$c" llama3_8b_graph_step_time_ctx128_gpu; done
for m in q06 l8; do for len in 500 4000; do for c in 8 0; do
  MINISGL_DECODE_CLUSTER=$c timeout 60 $BIN/minisgl bench --model /tmp/$m --load-format dummy --device cuda --vocab-size 100000 --num-requests 1 --min-len $len --max-len $len > $W/b1-$m-$len-$c.log 2>&1
  echo "bench b1 $m len=$len cluster=$c rc=$? $(grep -E 'output throughput|^time' $W/b1-$m-$len-$c.log | tr '\n' ' ')" >> $S
done; done; done
echo "end at $(( $(date +%s) - START )) s" >> $S
