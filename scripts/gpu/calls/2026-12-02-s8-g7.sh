#!/bin/bash
# (Ran an uncommitted rule change: skinny::plan also took products of up to 8 rows and
# k <= 4096 whose grid is one 90-100% full wave, switched by MINISGL_SKINNY_ONE_WAVE; it
# lost in the step and was reverted. docs/PERF.md, eighth session, call 7.)
# Eighth session, call 7 (the one-wave part of the skinny rule: Llama-3-8B o_proj on the skinny kernel): the
# tests of everything `linear` reaches, the graphed Llama-3-8B step with the one-wave
# part on and off (twice), the o_proj GEMM cases, the Qwen3-0.6B bench.
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
mkdir -p /tmp/q06; cp tests/configs/qwen3-0.6b/config.json /tmp/q06/; cp tests/fixtures/qwen3-tiny/tokenizer* /tmp/q06/
t 120 fused $T/kernel-runtime-gpu_fused --test-threads=1
wait
t 90 fixtures $T/models-gpu_fixtures --test-threads=1
t 100 graphs $T/engine-gpu_graphs --test-threads=1
t 90 overlap $T/engine-gpu_overlap --test-threads=1
echo "tests done at $(( $(date +%s) - START )) s" >> $S
step() { local name=$1; shift; [ $(left) -lt 40 ] && return; timeout 100 $T/engine-gpu_graphs $1 --test-threads=1 --nocapture 2>&1 | grep SUMMARY | sed "s/^/$name /" >> $S; }
step l8b llama3_8b_graph_step_time
( export MINISGL_SKINNY_ONE_WAVE=0; step l8b-nowave llama3_8b_graph_step_time )
step l8b-again llama3_8b_graph_step_time
( export MINISGL_SKINNY_ONE_WAVE=0; step l8b-nowave-again llama3_8b_graph_step_time )
MINISGL_GEMM_BENCH_SHAPES="llama3-8b o" timeout 60 $BB/minisgl-gemm --bench --warm-up-time 0.1 --measurement-time 0.2 2>&1 | grep SUMMARY | grep -E "m=(1|4|16) " | grep -E "cublaslt|linear:|skinny1:" >> $S
[ $(left) -gt 40 ] && { timeout 40 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench.log 2>&1; echo "bench rc=$? $(grep -E 'output throughput|^time' $W/bench.log | tr '\n' ' ')" >> $S; }
echo "end at $(( $(date +%s) - START )) s" >> $S
