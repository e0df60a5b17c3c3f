#!/bin/bash
# Seventh session, call 3 (prefill tile 17 the default on sm_90, an AOT instance): the
# prefill tests and the engines' tests with it, the prefill cases (default, tiles 16 and
# 17) beside SDPA, the benches.
START=$(date +%s); left() { echo $(( ${BUDGET:-430} - ($(date +%s) - START) )); }
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests; BB=$BIN/benches
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
fin() { cat $W/t-*.sum >> $S 2>/dev/null; cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w; }
trap fin EXIT
t() { local to=$1 name=$2; shift 2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 10 ] && { echo "$name skipped" > $W/t-$name.sum; return; }
  timeout $to "$@" > $W/$name.log 2>&1; echo "$name rc=$? $(grep -E '^test result' $W/$name.log | tail -1) ($(( $(date +%s) - START )) s)" > $W/t-$name.sum; grep -E 'panicked|FAILED|failed:' $W/$name.log | head -12 >> $W/t-$name.sum; }
mkdir -p /tmp/q06; cp tests/configs/qwen3-0.6b/config.json /tmp/q06/; cp tests/fixtures/qwen3-tiny/tokenizer* /tmp/q06/
t 200 prefill $T/kernel-runtime-gpu_prefill --test-threads=2 &
t 90 fixtures $T/models-gpu_fixtures --test-threads=1
t 100 graphs $T/engine-gpu_graphs --test-threads=1
t 90 overlap $T/engine-gpu_overlap --test-threads=1
wait
echo "tests done at $(( $(date +%s) - START )) s" >> $S
MINISGL_BENCH_PREFILL_TILES=16,17 timeout 60 $BB/minisgl-attention prefill --bench --warm-up-time 0.1 --measurement-time 0.2 2>&1 | grep SUMMARY | grep -v prefill-tile >> $S
[ $(left) -gt 40 ] && { timeout 40 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench.log 2>&1; echo "bench rc=$? $(grep -E 'output throughput|^time' $W/bench.log | tr '\n' ' ')" >> $S; grep -E "^  (decode|prefill)" $W/bench.log >> $S; }
mkdir -p /tmp/q30; cp tests/configs/qwen3-30b-a3b/config.json /tmp/q30/; cp tests/fixtures/qwen3-tiny/tokenizer* /tmp/q30/
[ $(left) -gt 60 ] && { timeout $(( $(left) - 5 )) $BIN/minisgl bench --model /tmp/q30 --load-format dummy --device cuda --vocab-size 151643 > $W/bench30.log 2>&1; echo "bench30 rc=$? $(grep -E 'output throughput|^time' $W/bench30.log | tr '\n' ' ')" >> $S; grep -E "^  (decode|prefill)" $W/bench30.log >> $S; }
echo "end at $(( $(date +%s) - START )) s" >> $S
