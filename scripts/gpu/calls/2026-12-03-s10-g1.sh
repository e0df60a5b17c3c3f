#!/bin/bash
# Tenth session, call 1: batch-1 decode attention. The graph-timed cold bench (every launch
# from HBM) of the eager plan and the graph plan at each pipeline depth of its split
# instance (MINISGL_DECODE_GRAPH_STAGES), merge in the launch or in the combine launch; the
# graphed steps under those knobs; the decode kernel's tests (its first tiles' page loads
# now side by side).
START=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - START) )); }
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests; BB=$BIN/benches
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
fin() { cat $W/t-*.sum >> $S 2>/dev/null; cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w; }
trap fin EXIT
t() { local to=$1 name=$2; shift 2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 10 ] && { echo "$name skipped" > $W/t-$name.sum; return; }
  timeout $to "$@" > $W/$name.log 2>&1; echo "$name rc=$? $(grep -E '^test result' $W/$name.log | tail -1) ($(( $(date +%s) - START )) s)" > $W/t-$name.sum; grep -E 'panicked|FAILED|failed:|error' $W/$name.log | head -12 >> $W/t-$name.sum; }
step() { local name=$1; shift; [ $(left) -lt 40 ] && { echo "$name skipped" >> $S; return; }; timeout 90 $T/engine-gpu_graphs $1 --test-threads=1 --nocapture 2>&1 | grep SUMMARY | sed "s/^/$name /" >> $S; }
t 120 decode $T/kernel-runtime-gpu_decode --test-threads=1
( export MINISGL_BENCH_ATTENTION=cold; timeout 150 $BB/minisgl-attention --bench > $W/bench-attention.log 2>&1; echo "bench rc=$?" >> $S; grep SUMMARY $W/bench-attention.log >> $S )
( export MINISGL_GEMM_BENCH_SHAPES=llama3-8b MINISGL_GEMM_BENCH_MS=64; timeout 100 $BB/minisgl-gemm --bench --warm-up-time 1 --measurement-time 1 > $W/bench-gemm.log 2>&1; echo "gemm rc=$?" >> $S; grep SUMMARY $W/bench-gemm.log >> $S )
echo "bench done at $(( $(date +%s) - START )) s" >> $S
for m in qwen3_0_6b llama3_8b; do
  step default-1 ${m}_graph_step_time
  ( export MINISGL_DECODE_GRAPH_STAGES=3; step gs3-1 ${m}_graph_step_time )
  ( export MINISGL_DECODE_GRAPH_STAGES=4; step gs4-1 ${m}_graph_step_time )
  ( export MINISGL_DECODE_GRAPH_STAGES=3 MINISGL_DECODE_SPLIT_MERGE=auto; step gs3merge-1 ${m}_graph_step_time )
done
for m in qwen3_0_6b llama3_8b; do
  step default-2 ${m}_graph_step_time
  ( export MINISGL_DECODE_GRAPH_STAGES=3; step gs3-2 ${m}_graph_step_time )
done
echo "steps done at $(( $(date +%s) - START )) s" >> $S
( export MINISGL_DECODE_GRAPH_STAGES=3; t 100 graphs-gs3 $T/engine-gpu_graphs --test-threads=1 --skip step_time )
echo "end at $(( $(date +%s) - START )) s" >> $S
