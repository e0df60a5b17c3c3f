#!/bin/bash
# Call 3 (fifth session): the chosen defaults: every GPU test, decode-step times, the benchmark.
START=$(date +%s)
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle && touch /tmp/minisgl-bundle/.stamp
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests; BB=$BIN/benches
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
mkdir -p $ROOT/target/release && ln -sf $BIN/minisgl $ROOT/target/release/minisgl
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
fin() { cp $S $W/; tar czf $OUT/logs.tgz -C $W . ; }
trap fin EXIT
left() { echo $(( ${BUDGET:-500} - ($(date +%s) - START) )); }
t() { local to=$1 name=$2; shift 2; timeout $to "$@" > $W/$name.log 2>&1; echo "$name rc=$? $(grep -E '^test result' $W/$name.log | tail -1)" >> $W/t-$name.sum; grep -E 'panicked|FAILED' $W/$name.log | head -12 >> $W/t-$name.sum; }
for m in qwen3-0.6b llama3-8b qwen3-30b-a3b; do mkdir -p /tmp/$m; cp tests/configs/$m/config.json /tmp/$m/; cp tests/fixtures/qwen3-tiny/tokenizer* /tmp/$m/; done
mb() { local name=$1 m=$2 v=$3; shift 3; [ $(left) -lt 40 ] && { echo "$name skipped" >> $S; return; }; timeout 80 env "$@" $BIN/minisgl bench --model /tmp/$m --load-format dummy --device cuda --vocab-size $v > $W/$name.log 2>&1; echo "$name rc=$? $(grep -E 'output throughput|^time' $W/$name.log | tr '\n' ' ')" >> $S; }
# 1. every GPU test binary, in parallel groups (the step-time tests run alone below)
# the big models one at a time (30B-size dummy weights are ~60 GB), the rest beside them
( t 150 engine-gpu_overlap $T/engine-gpu_overlap --test-threads=1; MINISGL_SKINNY_GATED=0 t 60 overlap_nogated $T/engine-gpu_overlap overlap_equals_no_overlap_qwen3_0_6b --test-threads=1;
  t 200 engine-gpu_graphs $T/engine-gpu_graphs --skip step_time --test-threads=1; t 150 engine-gpu_extras $T/engine-gpu_extras --test-threads=1;
  t 150 models-gpu_dummy $T/models-gpu_dummy --test-threads=1; t 150 engine-gpu_tp $T/engine-gpu_tp --test-threads=1 ) &
for x in $T/kernel-runtime-* $T/models-gpu_fixtures; do n=$(basename $x); t 240 $n $x --test-threads=1 & done
wait
cat $W/t-*.sum >> $S; echo "tests done at $(( $(date +%s) - START )) s" >> $S
# 2. decode-step times, then the benchmark
timeout 120 $T/engine-gpu_graphs step_time --test-threads=1 --nocapture > $W/steps.log 2>&1; echo "steps rc=$?" >> $S; grep SUMMARY $W/steps.log >> $S
mb q06_1 qwen3-0.6b 151643
mb q06_2 qwen3-0.6b 151643
mb q06_nogated qwen3-0.6b 151643 MINISGL_SKINNY_GATED=0
mb q06_noprefetch qwen3-0.6b 151643 MINISGL_SKINNY_PREFETCH=0
mb q06_noskinny qwen3-0.6b 151643 MINISGL_SKINNY_GEMM=0
mb q06_waves3 qwen3-0.6b 151643 MINISGL_DECODE_PLAN=waves MINISGL_DECODE_STAGES=3
mb q06_nooverlap qwen3-0.6b 151643 MINISGL_DISABLE_OVERLAP=1
mb l8 llama3-8b 128000
mb moe30 qwen3-30b-a3b 151643
echo "end at $(( $(date +%s) - START )) s" >> $S
cat $S
