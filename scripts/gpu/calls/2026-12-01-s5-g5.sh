#!/bin/bash
# Call 5: step times and the benchmark under the final defaults (set here by env on the call-3 bundle).
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
export MINISGL_SKINNY_GATED=0 MINISGL_DECODE_SPLIT_MERGE=0
S=$OUT/summary.txt
timeout 100 $T/engine-gpu_graphs qwen3_0_6b_graph_step_time --test-threads=1 --nocapture 2>&1 | grep SUMMARY >> $S
timeout 100 $T/engine-gpu_graphs llama3_8b_graph_step_time --test-threads=1 --nocapture 2>&1 | grep SUMMARY >> $S
mkdir -p /tmp/q06; cp tests/configs/qwen3-0.6b/config.json /tmp/q06/; cp tests/fixtures/qwen3-tiny/tokenizer* /tmp/q06/
for i in 1 2; do timeout 60 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 2>&1 | grep -E "output throughput|^time" | tr '\n' ' ' >> $S; echo >> $S; done
cat $S
