#!/bin/bash
# Eleventh session, call 2 (the last 162 s of device time): the headline figures at the
# session's final code, each appended to the summary as soon as it exists: `minisgl bench`
# (Qwen3-0.6B), the graphed Llama-3-8B step near gpu_dummy's contexts, the Qwen3-30B-A3B
# step (MoE decode kernels), the Qwen3-0.6B step.
source .gpu/lib.sh
timeout 30 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench1.log 2>&1
echo "bench rc=$? $(grep -E 'output throughput|^time' $W/bench1.log | tr '\n' ' ')" >> $S
step "" llama3_8b_graph_step_time_ctx128_gpu
step "" qwen3_30b_a3b_graph_step_time_gpu
step "" qwen3_0_6b_graph_step_time_gpu
echo "end at $(( $(date +%s) - START )) s" >> $S
