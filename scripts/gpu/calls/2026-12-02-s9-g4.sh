#!/bin/bash
# Ninth session, call 4: the skinny rule's tile width at Qwen3-0.6B's projections (the
# graph-timed bench of call 3: two tiles faster at n = 4096-6144), measured in the graphed
# step with MINISGL_SKINNY_TWO_TILES_MIN_N (default 64 x SMs = 8448), with the gated kernel
# again, and the correctness tests the choice reaches.
START=$(date +%s); left() { echo $(( ${BUDGET:-400} - ($(date +%s) - START) )); }
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
step() { local name=$1; shift; [ $(left) -lt 30 ] && { echo "$name skipped" >> $S; return; }; timeout 60 $T/engine-gpu_graphs $1 --test-threads=1 --nocapture 2>&1 | grep SUMMARY | grep "bs=1 " | sed "s/^/$name /" >> $S; }
Q=qwen3_0_6b_graph_step_time
for r in 1 2 3; do
  step default-$r $Q
  ( export MINISGL_SKINNY_TWO_TILES_MIN_N=6144; step min6144-$r $Q )
  ( export MINISGL_SKINNY_TWO_TILES_MIN_N=4096; step min4096-$r $Q )
  ( export MINISGL_SKINNY_TWO_TILES_MIN_N=1024; step min1024-$r $Q )
  ( export MINISGL_SKINNY_GATED=1; step gated-$r $Q )
  ( export MINISGL_SKINNY_GATED=1 MINISGL_SKINNY_TWO_TILES_MIN_N=4096; step gated-min4096-$r $Q )
done
echo "steps done at $(( $(date +%s) - START )) s" >> $S
( export MINISGL_SKINNY_TWO_TILES_MIN_N=4096; t 90 overlap-min4096 $T/engine-gpu_overlap --test-threads=1 )
( export MINISGL_SKINNY_TWO_TILES_MIN_N=4096; t 90 graphs-min4096 $T/engine-gpu_graphs --test-threads=1 --skip step_time )
( export MINISGL_SKINNY_GATED=1; t 90 overlap-gated $T/engine-gpu_overlap --test-threads=1 )
t 90 fused $T/kernel-runtime-gpu_fused --test-threads=1
echo "end at $(( $(date +%s) - START )) s" >> $S
