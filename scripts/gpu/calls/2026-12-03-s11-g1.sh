#!/bin/bash
# Eleventh session, call 1: the measured cuBLASLt choice (gemm_tune), the MoE decode
# kernels (moe_decode.cu) and the rewritten sampling kernel: their tests, the graphed
# steps with tuning on and off, benches/moe.rs's decode lines, sampling in
# benches/small_ops.rs, `minisgl bench` (Qwen3-0.6B and the 30B-A3B config).
source .gpu/lib.sh
t 150 graphs $T/engine-gpu_graphs --test-threads=1 --nocapture
grep "SUMMARY" $W/graphs.log | grep -v graph-fixture >> $S
t 120 moe $T/kernel-runtime-gpu_moe --test-threads=1
t 60 sampling $T/kernel-runtime-gpu_sampling --test-threads=1
t 60 overlap $T/engine-gpu_overlap --test-threads=1
t 40 fixtures $T/models-gpu_fixtures --test-threads=1
echo "tests done at $(( $(date +%s) - START )) s" >> $S
MINISGL_GEMM_TUNE=0 step "tune=0" llama3_8b_graph_step_time_ctx128_gpu
MINISGL_GEMM_TUNE=0 step "tune=0" qwen3_0_6b_graph_step_time_gpu
MINISGL_MOE_DECODE_MAX_TOKENS=0 step "moe-decode=0" qwen3_30b_a3b_graph_step_time_gpu
[ $(left) -gt 60 ] && { MINISGL_MOE_BENCH_TILES=none timeout 100 $BB/minisgl-moe --bench > $W/moe-bench.log 2>&1; grep -E "^SUMMARY moe(-experts|-decode|-grouped)? M=" $W/moe-bench.log >> $S; }
[ $(left) -gt 60 ] && { timeout 60 $BB/minisgl-small_ops --bench > $W/small-bench.log 2>&1; grep -E "^SUMMARY small sampl" $W/small-bench.log >> $S; }
for b in 1 2; do
  [ $(left) -gt 40 ] && { timeout 40 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench$b.log 2>&1; echo "bench rc=$? $(grep -E 'output throughput|^time' $W/bench$b.log | tr '\n' ' ')" >> $S; }
done
[ $(left) -gt 40 ] && { MINISGL_GEMM_TUNE=0 timeout 40 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench-tune0.log 2>&1; echo "bench tune=0 rc=$? $(grep -E 'output throughput|^time' $W/bench-tune0.log | tr '\n' ' ')" >> $S; }
echo "end at $(( $(date +%s) - START )) s" >> $S
