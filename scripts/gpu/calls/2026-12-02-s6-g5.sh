#!/bin/bash
# Sixth session, call 5: engine-gpu_tp alone (in call 4 its throughput comparison ran
# beside the kernel tests and measured their contention).
START=$(date +%s); left() { echo $(( ${BUDGET:-200} - ($(date +%s) - START) )); }
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
mkdir -p $ROOT/target/release; ln -sf $BIN/minisgl $ROOT/target/release/minisgl
t 150 tp $T/engine-gpu_tp --test-threads=1
grep SUMMARY $W/tp.log >> $S
