#!/bin/bash
# (Ran the L2 prefetch of commits 3c1c7ca / a8a6519, reverted after call 2: it made every
# bs=1 step slower; docs/PERF.md, ninth session.)
# Ninth session, call 1 (the L2 prefetch of small decode steps): its tests and the cold /
# after-prefetch GEMM figure, the tests the prefetch reaches (fixtures, graphs, overlap),
# then the graphed steps of Llama-3-8B, Qwen3-0.6B and Qwen3-30B-A3B with the prefetch
# off, `layer` (the default) and `attn`, interleaved.
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
t 60 prefetch $T/kernel-runtime-gpu_l2_prefetch --test-threads=1 --nocapture
grep SUMMARY $W/prefetch.log >> $S
t 90 fixtures $T/models-gpu_fixtures --test-threads=1
t 100 graphs $T/engine-gpu_graphs --test-threads=1 --skip step_time
t 90 overlap $T/engine-gpu_overlap --test-threads=1
echo "tests done at $(( $(date +%s) - START )) s" >> $S
step() { local name=$1; shift; [ $(left) -lt 40 ] && { echo "$name skipped" >> $S; return; }; timeout 100 $T/engine-gpu_graphs $1 --test-threads=1 --nocapture 2>&1 | grep SUMMARY | sed "s/^/$name /" >> $S; }
for m in qwen3_0_6b llama3_8b qwen3_30b_a3b; do
  ( export MINISGL_L2_PREFETCH=0; step $m-off ${m}_graph_step_time )
  ( export MINISGL_L2_PREFETCH=layer; step $m-layer ${m}_graph_step_time )
  ( export MINISGL_L2_PREFETCH=attn; step $m-attn ${m}_graph_step_time )
done
echo "end at $(( $(date +%s) - START )) s" >> $S
