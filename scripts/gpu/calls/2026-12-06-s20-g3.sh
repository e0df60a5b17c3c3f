#!/bin/bash
# Twentieth session, call 3 (bundle of the one-consumer tiles' commit): on an H200
# first Qwen3-0.6B bs=1 (two rounds) and Llama-3-8B at ctx 128 against their targets;
# then the prefill tiles 17, 27 (the long-run default), 30, and the one-consumer,
# two-blocks-an-SM tiles 32 and 33 beside SDPA; their correctness; on an H200 with
# time left the 30B step and the bench.
BUDGET=${BUDGET:-330}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
H200=0; grep -q H200 $S && H200=1
if [ $H200 = 1 ]; then
  for i in 1 2; do step_with "r$i" qwen3_0_6b_graph_step_time_gpu; done
  step_with "r1" llama3_8b_graph_step_time_ctx128_gpu
fi
MINISGL_BENCH_PREFILL_TILES=17,27,30,32,33 timeout 150 $BB/minisgl-attention "prefill-new" --bench --warm-up-time 0.1 --measurement-time 0.2 > $W/attn.log 2>&1
echo "attn rc=$? ($(( $(date +%s) - START )) s)" >> $S
grep -E "SUMMARY (prefill|decode 32/8 page=16 b=(64|256|1) ctx=(2048|1024|4096):|decode 16/8 page=16 b=64 ctx=U)" $W/attn.log | grep -v prefill-tile >> $S
PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1; echo "torch rc=$?" >> $S; grep SUMMARY $W/torch.log >> $S
t 60 wg_tiles env MINISGL_TEST_PREFILL_TILES=32,33 $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_tiles --test-threads=1
t 40 wg_long env MINISGL_TEST_PREFILL_TILES=27,32,33 $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_long --test-threads=1
if [ $H200 = 1 ]; then
  step_with "r1" qwen3_30b_a3b_graph_step_time_gpu
  [ $(left) -gt 50 ] && { timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/mbench.log 2>&1
    echo "mbench rc=$? $(grep -E 'output throughput|^time' $W/mbench.log | tr '\n' ' ')" >> $S; }
fi
echo "end at $(( $(date +%s) - START )) s" >> $S
