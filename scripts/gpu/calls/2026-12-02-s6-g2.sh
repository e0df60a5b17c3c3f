#!/bin/bash
# Sixth session, call 2 (the merged branches: the pre-norm skinny variant, the wgmma prefill
# tiles, the wgmma MoE tiles): correctness first (kernel tests side by side, the engines one
# at a time), then step times and the bench with the pre-norm variant on and off.
START=$(date +%s); left() { echo $(( ${BUDGET:-570} - ($(date +%s) - START) )); }
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests; BB=$BIN/benches
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
fin() { cat $W/t-*.sum >> $S 2>/dev/null; cp $S $W/; tar czf $OUT/logs.tgz -C $W . ; }
trap fin EXIT
t() { local to=$1 name=$2; shift 2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 10 ] && { echo "$name skipped" > $W/t-$name.sum; return; }
  timeout $to "$@" > $W/$name.log 2>&1; echo "$name rc=$? $(grep -E '^test result' $W/$name.log | tail -1) ($(( $(date +%s) - START )) s)" > $W/t-$name.sum; grep -E 'panicked|FAILED|failed:' $W/$name.log | head -12 >> $W/t-$name.sum; }
mkdir -p /tmp/q06; cp tests/configs/qwen3-0.6b/config.json /tmp/q06/; cp tests/fixtures/qwen3-tiny/tokenizer* /tmp/q06/
qbench() { local name=$1; shift; [ $(left) -lt 25 ] && { echo "$name skipped" >> $S; return; }; timeout 40 env "$@" $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/$name.log 2>&1; echo "$name rc=$? $(grep -E 'output throughput|^time' $W/$name.log | tr '\n' ' ')" >> $S; grep -E "^  (decode|prefill)" $W/$name.log >> $S; }
# 1. kernel tests side by side (the wgmma prefill tiles compile through NVRTC: the longest)
t 300 prefill_wgmma $T/kernel-runtime-gpu_prefill wgmma --test-threads=2 &
t 300 moe $T/kernel-runtime-gpu_moe --test-threads=2 &
t 200 fused $T/kernel-runtime-gpu_fused --test-threads=2 &
t 200 ops $T/kernel-runtime-gpu_ops --test-threads=2 &
# 2. the engines, one at a time, beside the kernel tests
t 150 fixtures $T/models-gpu_fixtures --test-threads=1
t 150 replay $T/engine-gpu_graphs graph_replay_equals_eager --test-threads=1
t 150 overlap $T/engine-gpu_overlap --test-threads=1
wait
echo "tests done at $(( $(date +%s) - START )) s" >> $S
# 3. step times and the bench, the pre-norm variant on and off; the graph split waves at bs=1
step() { local name=$1; shift; [ $(left) -lt 60 ] && return; timeout 90 env "$@" $T/engine-gpu_graphs qwen3_0_6b_graph_step_time --test-threads=1 --nocapture 2>&1 | grep SUMMARY | sed "s/^/$name /" >> $S; }
step norm1 MINISGL_SKINNY_NORM=1
step norm0 MINISGL_SKINNY_NORM=0
step norm1_gsw1 MINISGL_SKINNY_NORM=1 MINISGL_DECODE_GRAPH_SPLIT_WAVES=1
qbench bench_norm1 MINISGL_SKINNY_NORM=1
# 4. the wgmma tiles' speed (if their tests ran): MoE pairs, prefill tiles
bench() { local to=$1 name=$2; shift 2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 15 ] && { echo "$name skipped" >> $S; return; }
  timeout $to "$@" --bench --warm-up-time 0.1 --measurement-time 0.2 > $W/$name.log 2>&1; echo "$name rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep -E '^SUMMARY' $W/$name.log >> $S; }
MINISGL_MOE_BENCH_TILES=3,4,16,18,19,20,21,23 bench 110 moe $BB/minisgl-moe
MINISGL_BENCH_PREFILL_TILES=0,16,19,20 bench 90 prefill $BB/minisgl-attention prefill
echo "end at $(( $(date +%s) - START )) s" >> $S
