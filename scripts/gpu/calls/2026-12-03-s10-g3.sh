#!/bin/bash
# Tenth session, call 3: the new defaults (graph split plan at one wave of blocks; the
# combine phase reads its row's length before its grid wait): replay = eager and the step
# figures (engine-gpu_graphs, with Llama-3-8B near gpu_dummy's contexts too), overlap on =
# off, the fixtures, the decode kernel's tests; `minisgl bench`; ncu of an eager
# Qwen3-0.6B bs=64 step.
START=$(date +%s); left() { echo $(( ${BUDGET:-540} - ($(date +%s) - START) )); }
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests; BB=$BIN/benches
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
fin() { cat $W/t-*.sum >> $S 2>/dev/null; [ -f $W/ncu_q06_64.csv ] && python3 scripts/gpu/ncu_table.py $W/ncu_q06_64.csv ncu_q06_bs64 >> $S 2>&1; cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w; }
trap fin EXIT
t() { local to=$1 name=$2; shift 2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 10 ] && { echo "$name skipped" > $W/t-$name.sum; return; }
  timeout $to "$@" > $W/$name.log 2>&1; echo "$name rc=$? $(grep -E '^test result' $W/$name.log | tail -1) ($(( $(date +%s) - START )) s)" > $W/t-$name.sum; grep -E 'panicked|FAILED|failed:|error' $W/$name.log | head -12 >> $W/t-$name.sum; }
step() { local name=$1; shift; [ $(left) -lt 40 ] && { echo "$name skipped" >> $S; return; }; timeout 90 $T/engine-gpu_graphs $1 --test-threads=1 --nocapture 2>&1 | grep SUMMARY | sed "s/^/$name /" >> $S; }
mkdir -p /tmp/q06; cp tests/configs/qwen3-0.6b/config.json /tmp/q06/; cp tests/fixtures/qwen3-tiny/tokenizer* /tmp/q06/
t 130 graphs $T/engine-gpu_graphs --test-threads=1 --nocapture
grep "SUMMARY graph-step" $W/graphs.log >> $S
t 80 overlap $T/engine-gpu_overlap --test-threads=1
t 60 fixtures $T/models-gpu_fixtures --test-threads=1
t 110 decode $T/kernel-runtime-gpu_decode --test-threads=1
echo "tests done at $(( $(date +%s) - START )) s" >> $S
for b in 1 2; do
  [ $(left) -gt 40 ] && { timeout 40 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench$b.log 2>&1; echo "bench rc=$? $(grep -E 'output throughput|^time' $W/bench$b.log | tr '\n' ' ')" >> $S; }
done
M="--metrics gpu__time_duration.sum,dram__bytes.sum --csv --clock-control none"
[ $(left) -gt 50 ] && { timeout $(( $(left) - 40 )) ncu $M --launch-skip 3000 --launch-count 200 $T/models-gpu_dummy qwen3_0_6b_dummy_decode_bs64 --test-threads=1 > $W/ncu_q06_64.csv 2>&1; echo "ncu q06 bs64 rc=$? at $(( $(date +%s) - START )) s" >> $S; }
t 40 dummy-q06-64 $T/models-gpu_dummy qwen3_0_6b_dummy_decode_bs64 --test-threads=1 --nocapture
grep SUMMARY $W/dummy-q06-64.log >> $S
echo "end at $(( $(date +%s) - START )) s" >> $S
