#!/bin/bash
# Call 4: the graph-replay / extras / overlap failures of call 3 under the candidate defaults (env only).
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
S=$OUT/summary.txt
t() { local name=$1; shift; timeout 90 "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $(grep -E '^test result' $OUT/$name.log | tail -1)" >> $S; grep -E 'panicked|differ' $OUT/$name.log | head -6 >> $S; }
export MINISGL_SKINNY_GATED=0
MINISGL_DECODE_SPLIT_MERGE=0 t replay_nomerge $T/engine-gpu_graphs graph_replay_equals_eager_step_gpu --test-threads=1
MINISGL_DECODE_SPLIT_MERGE=0 t extras_nomerge $T/engine-gpu_extras --test-threads=1
MINISGL_DECODE_SPLIT_MERGE=0 t overlap_nomerge $T/engine-gpu_overlap --test-threads=1
MINISGL_DECODE_SPLIT_MERGE=0 MINISGL_DECODE_PLAN=waves t replay_nomerge_waves $T/engine-gpu_graphs graph_replay_equals_eager_step_gpu --test-threads=1
cat $S
