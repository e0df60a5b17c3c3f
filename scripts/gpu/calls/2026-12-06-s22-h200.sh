#!/bin/bash
# Twenty-second session: every open H200 figure of issues 12, 13 and 15 under the
# current defaults, most wanted first; on any other card it stops after naming it (a
# run asked for the H200 kind may get an H100). Qwen3-0.6B bs=1 against 0.8 ms (two
# rounds; the summary's "host and idle" share is issue 13's idle figure), Llama-3-8B
# bs=1 / bs=64 at ctx 128 against 4.3 / 5.5 ms, the 30B's bs=1 against 2.2 ms (bs=64
# recorded), the bench against 30,000 tok/s, the fused MoE beside Triton, the
# attention targets beside torch SDPA (decode cold and prefill: tiles $PREFILL_TILES,
# default 17 and 27), the 30B bench.
BUDGET=${BUDGET:-580}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
grep -q H200 $S || { echo "not an H200: stopped" >> $S; exit 0; }
for i in 1 2; do step_with "r$i" qwen3_0_6b_graph_step_time_gpu; done
step_with "r1" llama3_8b_graph_step_time_ctx128_gpu
step_with "r1" qwen3_30b_a3b_graph_step_time_gpu
timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/mbench.log 2>&1
echo "mbench rc=$? $(grep -E 'output throughput|^time' $W/mbench.log | tr '\n' ' ')" >> $S
MINISGL_MOE_BENCH_TILES=none bench 60 moe $BB/minisgl-moe
[ $(left) -gt 45 ] && { PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/moe_triton_baseline.py > $W/triton.log 2>&1; echo "triton rc=$?" >> $S; grep SUMMARY $W/triton.log | head -12 >> $S; }
MINISGL_BENCH_ATTENTION=cold MINISGL_BENCH_ATTENTION_FILTER="decode" bench 80 attn-decode $BB/minisgl-attention decode
MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=${PREFILL_TILES:-17,27} bench 80 attn-prefill $BB/minisgl-attention prefill
[ $(left) -gt 70 ] && { PYTHONUNBUFFERED=1 timeout 60 python3 scripts/gpu/torch_baselines.py decode prefill > $W/torch.log 2>&1; echo "torch rc=$?" >> $S; grep SUMMARY $W/torch.log >> $S; }
[ $(left) -gt 70 ] && { mkdir -p /tmp/q30; cp tests/configs/qwen3-30b-a3b/config.json /tmp/q30/; cp tests/fixtures/qwen3-tiny/tokenizer* /tmp/q30/
  timeout $(( $(left) - 5 )) $BIN/minisgl bench --model /tmp/q30 --load-format dummy --device cuda --vocab-size 151643 > $W/mbench30.log 2>&1
  echo "mbench30 rc=$? $(grep -E 'output throughput|^time|load' $W/mbench30.log | tr '\n' ' ')" >> $S; }
echo "end at $(( $(date +%s) - START )) s" >> $S
