#!/bin/bash
# Eighth session, call 6 (commit ad51725): benches/gemm.rs at the Llama-3-8B and
# Qwen3-30B-A3B shapes beside torch.matmul in the same run (the stream_gemm record).
START=$(date +%s)
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; BB=$BIN/benches
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
S=$OUT/summary.txt; : > $S
G="--bench --warm-up-time 0.1 --measurement-time 0.2"
for sh in llama3-8b qwen3-30b; do
  MINISGL_GEMM_BENCH_SHAPES=$sh timeout 120 $BB/minisgl-gemm $G 2>&1 | grep -E "SUMMARY|failed" | grep -E "m=(1|16) |failed" | grep -E "cublaslt|linear:|stream|skinny1:|failed" >> $S
done
PYTHONUNBUFFERED=1 timeout 60 python3 scripts/gpu/torch_gemm_baselines.py 2>&1 | grep SUMMARY | grep -E "llama|30b" | grep -E "m=(1|16) " >> $S
echo "end at $(( $(date +%s) - START )) s" >> $S
