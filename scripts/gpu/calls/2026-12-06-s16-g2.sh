#!/bin/bash
# Sixteenth session, call 2 (the bundle of call 1, on the machine call 1 left warm): the
# fused MoE against mini-sglang's Triton kernel in one run (issue 15's M = 1..4096 table on
# this card), ncu's per-instruction view of the fused-prologue and the plain decode kernels
# (the fifteenth session's call 4), then gpu_fused and gpu_ops side by side (not run in
# full since the ninth session), as far as the time goes.
BUDGET=${BUDGET:-450}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
bench() { local to=$1 name=$2; shift 2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 15 ] && { echo "$name skipped" >> $S; return; }
  timeout $to "$@" --bench --warm-up-time 0.1 --measurement-time 0.2 > $W/$name.log 2>&1; echo "$name rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep -E '^SUMMARY' $W/$name.log >> $S; }
MINISGL_MOE_BENCH_TILES=none bench 60 moe $BB/minisgl-moe
PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/moe_triton_baseline.py > $W/triton.log 2>&1; echo "triton rc=$?" >> $S; grep SUMMARY $W/triton.log | head -12 >> $S
ncu_decode fused MINISGL_DECODE_FUSED_ROPE=1
ncu_decode plain
echo "ncu done at $(( $(date +%s) - START )) s" >> $S
( t 180 fused $T/kernel-runtime-gpu_fused --test-threads=2 ) &
( t 180 ops $T/kernel-runtime-gpu_ops --test-threads=3 ) &
wait
echo "end at $(( $(date +%s) - START )) s" >> $S
