#!/bin/bash
# Ninth session, call 8 (the bundle of call 5): engine-gpu_tp again, with the minisgl
# binary linked where the test looks for it (call 7's script lacked the link).
START=$(date +%s)
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
mkdir -p $ROOT/target/release; ln -sf $BIN/minisgl $ROOT/target/release/minisgl
timeout 140 $T/engine-gpu_tp --test-threads=1 --nocapture > $OUT/tp.log 2>&1; echo "tp rc=$? ($(( $(date +%s) - START )) s)" > $OUT/summary.txt
grep -E "^test result|SUMMARY|panicked" $OUT/tp.log >> $OUT/summary.txt
