#!/bin/bash
# Eighteenth session: the headline figures on an H200 (the targets' card) under this
# session's defaults; on any other card it stops after naming it (a run asked for
# the H200 kind may get an H100). Qwen3-0.6B bs=1 against 0.8 ms (three rounds),
# Llama-3-8B bs=1 / bs=64 at ctx 128 against 4.3 / 5.5 ms, the 30B's bs=1 against 2.2
# ms, the bench against 30,000 tok/s, the fused MoE beside Triton in one run.
BUDGET=${BUDGET:-400}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
grep -q H200 $S || { echo "not an H200: stopped" >> $S; exit 0; }
for i in 1 2 3; do step_with "r$i" qwen3_0_6b_graph_step_time_gpu; done
for i in 1 2; do step_with "r$i" llama3_8b_graph_step_time_ctx128_gpu; done
step_with "r1" qwen3_30b_a3b_graph_step_time_gpu
timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench.log 2>&1
echo "bench rc=$? $(grep -E 'output throughput|^time' $W/bench.log | tr '\n' ' ')" >> $S
bench() { local to=$1 name=$2; shift 2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 15 ] && { echo "$name skipped" >> $S; return; }
  timeout $to "$@" --bench --warm-up-time 0.1 --measurement-time 0.2 > $W/$name.log 2>&1; echo "$name rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep -E '^SUMMARY' $W/$name.log >> $S; }
MINISGL_MOE_BENCH_TILES=none bench 60 moe $BB/minisgl-moe
[ $(left) -gt 45 ] && { PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/moe_triton_baseline.py > $W/triton.log 2>&1; echo "triton rc=$?" >> $S; grep SUMMARY $W/triton.log | head -12 >> $S; }
echo "end at $(( $(date +%s) - START )) s" >> $S
