#!/bin/bash
# Ninth session, call 7 (the bundle of call 5, the final defaults): the GPU tests calls
# 4-5 did not run, the kernel tests beside the engine and model ones.
START=$(date +%s); left() { echo $(( ${BUDGET:-300} - ($(date +%s) - START) )); }
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
fin() { cat $W/t-*.sum >> $S 2>/dev/null; cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w; }
trap fin EXIT
t() { local to=$1 name=$2; shift 2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 10 ] && { echo "$name skipped" > $W/t-$name.sum; return; }
  timeout $to "$@" > $W/$name.log 2>&1; echo "$name rc=$? $(grep -E '^test result' $W/$name.log | tail -1) ($(( $(date +%s) - START )) s)" > $W/t-$name.sum; grep -E 'panicked|FAILED|failed:|error' $W/$name.log | head -12 >> $W/t-$name.sum; }
( for b in ops decode sampling store_index skinny_tiled stream_gemm; do t 120 $b $T/kernel-runtime-gpu_$b --test-threads=2; done ) &
t 120 tp $T/engine-gpu_tp --test-threads=1
t 150 dummy $T/models-gpu_dummy --test-threads=1 --nocapture
grep SUMMARY $W/dummy.log >> $S
wait
echo "end at $(( $(date +%s) - START )) s" >> $S
