#!/bin/bash
# Eleventh session, call 1: the measured cuBLASLt choice (gemm_tune) and the MoE decode
# kernels (moe_decode.cu): their tests, the graphed steps with tuning on and off and the
# MoE decode kernels on and off, benches/moe.rs's decode lines, benches/gemm.rs's
# cuBLASLt lines at m = 64 and 128. (The sampling kernel was mid-rewrite: its tests, the
# seeded overlap test and `minisgl bench` wait for call 2.)
source .gpu/lib.sh
t 150 graphs $T/engine-gpu_graphs --test-threads=1 --nocapture
grep "SUMMARY" $W/graphs.log | grep -v graph-fixture >> $S
t 120 moe $T/kernel-runtime-gpu_moe --test-threads=1
t 40 fixtures $T/models-gpu_fixtures --test-threads=1
echo "tests done at $(( $(date +%s) - START )) s" >> $S
MINISGL_GEMM_TUNE=0 step "tune=0" llama3_8b_graph_step_time_ctx128_gpu
MINISGL_GEMM_TUNE=0 step "tune=0" qwen3_0_6b_graph_step_time_gpu
MINISGL_MOE_DECODE_MAX_TOKENS=0 step "moe-decode=0" qwen3_30b_a3b_graph_step_time_gpu
[ $(left) -gt 60 ] && { MINISGL_MOE_BENCH_TILES=none timeout 100 $BB/minisgl-moe --bench > $W/moe-bench.log 2>&1; grep -E "^SUMMARY moe(-experts|-decode|-grouped)? M=" $W/moe-bench.log >> $S; }
[ $(left) -gt 60 ] && { MINISGL_GEMM_BENCH_MS=64,128 MINISGL_GEMM_BENCH_SHAPES=llama3-8b timeout 100 $BB/minisgl-gemm --bench > $W/gemm-bench.log 2>&1; grep -E "^SUMMARY gemm (tune|.*(cublaslt|linear))" $W/gemm-bench.log >> $S; }
echo "end at $(( $(date +%s) - START )) s" >> $S
