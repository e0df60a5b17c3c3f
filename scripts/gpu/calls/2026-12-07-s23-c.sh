#!/bin/bash
# Twenty-third session, third call (same bundle as b): on an H200 every open H200
# figure of issues 12, 13 and 15 (s23-h200.sh: the prefill line with tiles 17 and
# 28, the new default). Elsewhere the engine figures under the new default beside
# the last H100 ones (Qwen3-0.6B bs=1 graphed step twice, the 0.6B bench), then the
# persistent walks of tile 35 (its 64-key shape at head dim 256 is new).
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  exec bash .gpu/2026-12-07-s23-h200.sh
fi
BUDGET=${BUDGET:-400}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
for i in 1 2; do step_with "r$i" qwen3_0_6b_graph_step_time_gpu; done
timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/mbench.log 2>&1
echo "mbench rc=$? $(grep -E 'output throughput|^time' $W/mbench.log | tr '\n' ' ')" >> $S
t 150 walks env MINISGL_TEST_PREFILL_TILES=35 $T/kernel-runtime-gpu_prefill prefill_attention_gpu_persistent_walks --test-threads=1
echo "end at $(( $(date +%s) - START )) s" >> $S
