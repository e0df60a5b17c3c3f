#!/bin/bash
# Twentieth session, last call: the headline figures on an H200 (the targets' card;
# on any other card it stops after naming it): Qwen3-0.6B bs=1 against 0.8 ms (two
# rounds), Llama-3-8B bs=1 / bs=64 at ctx 128 against 4.3 / 5.5 ms, the 30B's bs=1
# against 2.2 ms, the bench against 30,000 tok/s, then the prefill tiles 17 and 27
# beside SDPA if time is left.
BUDGET=${BUDGET:-330}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
grep -q H200 $S || { echo "not an H200: stopped" >> $S; exit 0; }
for i in 1 2; do step_with "r$i" qwen3_0_6b_graph_step_time_gpu; done
step_with "r1" llama3_8b_graph_step_time_ctx128_gpu
step_with "r1" qwen3_30b_a3b_graph_step_time_gpu
[ $(left) -gt 50 ] && { timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench.log 2>&1
  echo "bench rc=$? $(grep -E 'output throughput|^time' $W/bench.log | tr '\n' ' ')" >> $S; }
[ $(left) -gt 150 ] && { MINISGL_BENCH_PREFILL_TILES=17,27 timeout $(( $(left) - 45 )) $BB/minisgl-attention "prefill-new" --bench --warm-up-time 0.1 --measurement-time 0.2 > $W/attn.log 2>&1
  echo "attn rc=$?" >> $S; grep -E "SUMMARY (prefill-new|decode 32/8 page=16 b=(64|256|1) ctx=(2048|1024|4096):|decode 16/8 page=16 b=64 ctx=U)" $W/attn.log >> $S
  PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1; echo "torch rc=$?" >> $S; grep SUMMARY $W/torch.log >> $S; }
echo "end at $(( $(date +%s) - START )) s" >> $S
