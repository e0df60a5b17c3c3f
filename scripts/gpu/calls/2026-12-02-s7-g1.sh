#!/bin/bash
# Seventh session, call 1: the data for the decode plan's instance choice (keys plan
# at 2 and 3 stages, and each unsplit from one wave, over a grid of batches), where
# batch 1's time goes (ncu sections of the b=1 ctx=4096 launch), decode attention
# inside a graphed and an eager `minisgl bench` step (ncu of its kernel nodes), and
# the tests of this bundle's changes (key tiles issued before the grid dependency
# wait, decode rows longest first).
START=$(date +%s); left() { echo $(( ${BUDGET:-500} - ($(date +%s) - START) )); }
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests; BB=$BIN/benches
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
fin() { for f in ncu_graph ncu_eager; do [ -f $W/$f.csv ] && python3 scripts/gpu/ncu_table.py $W/$f.csv $f > $W/$f.table.txt 2>&1; done
  cat $W/t-*.sum >> $S 2>/dev/null; cat $W/*.table.txt >> $S 2>/dev/null; cat $W/attn*.txt >> $S 2>/dev/null; cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w; }
trap fin EXIT
t() { local to=$1 name=$2; shift 2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 10 ] && { echo "$name skipped" > $W/t-$name.sum; return; }
  timeout $to "$@" > $W/$name.log 2>&1; echo "$name rc=$? $(grep -E '^test result' $W/$name.log | tail -1) ($(( $(date +%s) - START )) s)" > $W/t-$name.sum; grep -E 'panicked|FAILED|failed:' $W/$name.log | head -12 >> $W/t-$name.sum; }
M="--metrics gpu__time_duration.sum,dram__bytes.sum --csv --clock-control none"
A="--bench --warm-up-time 0.1 --measurement-time 0.2"
mkdir -p /tmp/q06; cp tests/configs/qwen3-0.6b/config.json /tmp/q06/; cp tests/fixtures/qwen3-tiny/tokenizer* /tmp/q06/
Q="--model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643"
# 1. the sweep, the issue-12 shapes' variants, batch 1's graph plan
MINISGL_BENCH_DECODE_SWEEP=1 timeout 150 $BB/minisgl-attention decode-sweep $A 2>&1 | grep SUMMARY > $W/attn_sweep.txt; echo "sweep $(left) s left" >> $S
timeout 70 $BB/minisgl-attention "decode-var|decode-graph|decode 32/8 page=16 b=1 " $A 2>&1 | grep SUMMARY > $W/attn_var.txt; echo "var $(left) s left" >> $S
# 2. batch 1 under ncu
timeout 60 ncu --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --launch-skip 40 --launch-count 4 $BB/minisgl-attention "decode 32/8 page=16 b=1 " $A > $W/ncu_b1.log 2>&1; echo "ncu b1 rc=$? $(left) s left" >> $S
grep -E "decode_attention|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Grid Size|Waves Per SM|Block Limit|Warp Cycles Per Issued|Stall" $W/ncu_b1.log | head -60 > $W/attn_ncu_b1.txt
# 3. the bench (graphs), then its decode attention under ncu, graphed and eager
timeout 60 $BIN/minisgl bench $Q > $W/bench.log 2>&1; echo "bench rc=$? $(grep -E 'output throughput|^time' $W/bench.log | tr '\n' ' ')" >> $S; grep -E "^  (decode|prefill)" $W/bench.log >> $S
[ $(left) -gt 200 ] && timeout 100 ncu $M --kernel-name regex:decode_attention --launch-skip 4000 --launch-count 300 $BIN/minisgl bench $Q > $W/ncu_graph.csv 2>&1; echo "ncu graph rc=$? $(left) s left" >> $S
[ $(left) -gt 170 ] && timeout 90 ncu $M --kernel-name regex:decode_attention --launch-skip 4000 --launch-count 300 $BIN/minisgl bench $Q --disable-cuda-graph > $W/ncu_eager.csv 2>&1; echo "ncu eager rc=$? $(left) s left" >> $S
# 4. tests of the changes (decode kernel: every variant and the store-then-attend race; the engine paths)
t 150 decode $T/kernel-runtime-gpu_decode --test-threads=1 &
t 120 fixtures $T/models-gpu_fixtures --test-threads=1 &
wait
t 100 graphs $T/engine-gpu_graphs --test-threads=1
echo "end $(left) s left" >> $S
