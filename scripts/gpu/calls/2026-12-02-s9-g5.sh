#!/bin/bash
# Ninth session, call 5 (the new defaults: the gated gate_up kernel on, two tiles from
# n >= 32 x SMs): the tests the two reach (overlap twice, device path, graph replay,
# fixtures, fused, dummy models), the graphed steps of the three models, the benches.
START=$(date +%s); left() { echo $(( ${BUDGET:-330} - ($(date +%s) - START) )); }
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
t 60 overlap $T/engine-gpu_overlap --test-threads=1
t 60 overlap-again $T/engine-gpu_overlap --test-threads=1
t 60 extras $T/engine-gpu_extras --test-threads=1
t 60 fixtures $T/models-gpu_fixtures --test-threads=1
t 120 graphs $T/engine-gpu_graphs --test-threads=1 --nocapture
grep "SUMMARY graph-step" $W/graphs.log >> $S
echo "tests done at $(( $(date +%s) - START )) s" >> $S
timeout 60 $T/engine-gpu_graphs qwen3_0_6b_graph_step_time --test-threads=1 --nocapture 2>&1 | grep "SUMMARY graph-step" | sed "s/^/again /" >> $S
timeout 60 $T/engine-gpu_graphs qwen3_0_6b_graph_step_time --test-threads=1 --nocapture 2>&1 | grep "SUMMARY graph-step" | sed "s/^/again /" >> $S
[ $(left) -gt 40 ] && { timeout 40 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench.log 2>&1; echo "bench rc=$? $(grep -E 'output throughput|^time' $W/bench.log | tr '\n' ' ')" >> $S; }
t 150 fused $T/kernel-runtime-gpu_fused --test-threads=1
echo "end at $(( $(date +%s) - START )) s" >> $S
