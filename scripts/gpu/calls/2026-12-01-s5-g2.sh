#!/bin/bash
# Call 2 (fifth session): the helpers' kernels merged (decode tuning, skinny_tiled, MoE tiles, prefill):
# correctness in parallel, then the sweeps one at a time.
START=$(date +%s)
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle && touch /tmp/minisgl-bundle/.stamp
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests; BB=$BIN/benches
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
fin() { cp $S $W/; tar czf $OUT/logs.tgz -C $W . ; }
trap fin EXIT
left() { echo $(( ${BUDGET:-530} - ($(date +%s) - START) )); }
t() { local to=$1 name=$2; shift 2; timeout $to "$@" > $W/$name.log 2>&1; echo "$name rc=$? $(grep -E '^test result' $W/$name.log | tail -1)" >> $W/t-$name.sum; grep -E 'panicked|FAILED' $W/$name.log | head -12 >> $W/t-$name.sum; }
bench() { local to=$1 name=$2; shift 2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 10 ] && { echo "$name skipped" >> $S; return; }
  timeout $to "$@" --bench --warm-up-time 0.1 --measurement-time 0.2 > $W/$name.log 2>&1; echo "$name rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep -E '^SUMMARY' $W/$name.log > $W/sum-$name.txt; }
mkdir -p /tmp/q06; cp tests/configs/qwen3-0.6b/config.json /tmp/q06/; cp tests/fixtures/qwen3-tiny/tokenizer* /tmp/q06/
qbench() { local name=$1; shift; [ $(left) -lt 20 ] && { echo "$name skipped" >> $S; return; }; timeout 40 env "$@" $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/$name.log 2>&1; echo "$name rc=$? $(grep -E 'output throughput|^time' $W/$name.log | tr '\n' ' ')" >> $S; }
# 1. correctness, in parallel (results compared with CPU references; no timings here)
t 150 tiled $T/kernel-runtime-gpu_skinny_tiled --test-threads=1 &
t 150 decode $T/kernel-runtime-gpu_decode gpu_decode_variants_match_cpu_bf16 --test-threads=1 &
t 150 decode_shapes $T/kernel-runtime-gpu_decode gpu_decode_variants_at_benchmark_shapes --test-threads=1 &
t 150 prefill $T/kernel-runtime-gpu_prefill --skip tile_variants --test-threads=1 &
t 150 moe $T/kernel-runtime-gpu_moe qwen3_30b --test-threads=1 &
t 150 ops_attn $T/kernel-runtime-gpu_ops attention --test-threads=1 &
t 150 fixtures $T/models-gpu_fixtures --test-threads=1 &
t 150 replay $T/engine-gpu_graphs graph_replay_equals_eager_step_gpu --test-threads=1 &
t 150 overlap $T/engine-gpu_overlap overlap_equals_no_overlap_qwen3_0_6b --test-threads=1 &
MINISGL_SKINNY_GATED=0 t 150 overlap_nogated $T/engine-gpu_overlap overlap_equals_no_overlap_qwen3_0_6b --test-threads=1 &
MINISGL_SKINNY_TILED=0 t 150 overlap_notiled $T/engine-gpu_overlap overlap_equals_no_overlap_qwen3_0_6b --test-threads=1 &
MINISGL_SKINNY_TILED=0 MINISGL_SKINNY_GATED=0 t 150 overlap_notiled_nogated $T/engine-gpu_overlap overlap_equals_no_overlap_qwen3_0_6b --test-threads=1 &
wait
cat $W/t-*.sum >> $S; echo "tests done at $(( $(date +%s) - START )) s" >> $S
# 2. sweeps, one at a time
MINISGL_BENCH_PREFILL_TILES=0,2,3 bench 120 attention $BB/minisgl-attention
bench 100 gemm $BB/minisgl-gemm
MINISGL_MOE_BENCH_TILES=0,1,2,3,4,5,6,7,8,10,11,12,13,15,16 bench 100 moe $BB/minisgl-moe
bench 30 small $BB/minisgl-small_ops
qbench bench_default
qbench bench_keys MINISGL_DECODE_PLAN=keys
[ $(left) -gt 40 ] && { PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py > $W/torch.log 2>&1; echo "torch rc=$?" >> $S; }
[ $(left) -gt 30 ] && { PYTHONUNBUFFERED=1 timeout 30 python3 scripts/gpu/moe_triton_baseline.py > $W/triton.log 2>&1; echo "triton rc=$?" >> $S; }
echo "end at $(( $(date +%s) - START )) s" >> $S
cat $S
