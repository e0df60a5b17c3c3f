#!/bin/bash
# Eighth session, call 2 (stream_gemm without 64-bit divisions in its loops, chunk widths): its tests and the
# tests of everything `linear` reaches, benches/gemm.rs beside torch.matmul, the graphed
# decode steps with the streaming path on and off, the bench.
START=$(date +%s); left() { echo $(( ${BUDGET:-540} - ($(date +%s) - START) )); }
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
mkdir -p /tmp/q06; cp tests/configs/qwen3-0.6b/config.json /tmp/q06/; cp tests/fixtures/qwen3-tiny/tokenizer* /tmp/q06/
# 1. the new kernel's tests first (alone), then the engines' with it in `linear`
t 120 stream $T/kernel-runtime-gpu_stream_gemm --test-threads=1
cat $W/t-stream.sum >> $S
t 90 dummy $T/models-gpu_dummy --test-threads=1 &
t 90 fixtures $T/models-gpu_fixtures --test-threads=1
t 90 replay $T/engine-gpu_graphs graph_replay_equals_eager --test-threads=1
wait
echo "tests done at $(( $(date +%s) - START )) s" >> $S
# 2. GEMMs: ours (every variant) and torch.matmul in the same run
G="--bench --warm-up-time 0.1 --measurement-time 0.2"
MINISGL_GEMM_BENCH_SHAPES="qwen3-0.6b" timeout 90 $BB/minisgl-gemm $G 2>&1 | grep -E "SUMMARY|failed" | grep -E "m=(1|16) |failed" | grep -E "cublaslt|linear|stream|skinny[12]:|failed" >> $S
MINISGL_GEMM_BENCH_SHAPES=llama3-8b timeout 150 $BB/minisgl-gemm $G 2>&1 | grep -E "SUMMARY|failed" | grep -E "m=(1|4|16) |failed" | grep -vE "tiled|noprefetch|silu|split4" >> $S
MINISGL_GEMM_BENCH_SHAPES=qwen3-30b timeout 60 $BB/minisgl-gemm $G 2>&1 | grep -E "SUMMARY|failed" | grep -E "m=(1|4|16) |failed" | grep -vE "tiled|noprefetch|silu|split4" >> $S
echo "gemm $(left) s left" >> $S
[ $(left) -gt 250 ] && { PYTHONUNBUFFERED=1 timeout 60 python3 scripts/gpu/torch_gemm_baselines.py > $W/torch.log 2>&1; echo "torch rc=$?" >> $S; grep SUMMARY $W/torch.log | grep -E "llama|30b" | grep -E "m=(1|16) " >> $S; }
# 3. steps (graphs), streaming on and off
step() { local name=$1; shift; [ $(left) -lt 60 ] && return; timeout 100 $T/engine-gpu_graphs $1 --test-threads=1 --nocapture 2>&1 | grep SUMMARY | sed "s/^/$name /" >> $S; }
step l8b llama3_8b_graph_step_time
( export MINISGL_STREAM_GEMM=0; step l8b-nostream llama3_8b_graph_step_time )
step q06 qwen3_0_6b_graph_step_time
step 30b qwen3_30b_a3b_graph_step_time
[ $(left) -gt 40 ] && { timeout 40 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench.log 2>&1; echo "bench rc=$? $(grep -E 'output throughput|^time' $W/bench.log | tr '\n' ' ')" >> $S; }
# 4. ncu of one stream_gemm launch (Llama-3-8B gate_up, m = 1, default plan): where it stalls
[ $(left) -gt 70 ] && { MINISGL_GEMM_BENCH_SHAPES="llama3-8b gate_up" timeout 60 ncu --clock-control none --kernel-name regex:stream_gemm --launch-skip 30 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats $BB/minisgl-gemm $G > $W/ncu_stream.txt 2>&1; echo "ncu rc=$?" >> $S; grep -E "Duration|DRAM Throughput|Memory Throughput|Stall|Warp Cycles|Issued|Eligible" $W/ncu_stream.txt | head -30 >> $S; }
echo "end at $(( $(date +%s) - START )) s" >> $S
