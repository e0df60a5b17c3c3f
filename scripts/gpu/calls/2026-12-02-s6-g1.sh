#!/bin/bash
# Sixth session, call 1: the sm_90a build checked (kernel tests), decode attention at the
# bench's shapes, and where the time goes (ncu per-kernel tables of a bench decode step in
# the middle and in the tail of the run, of a Qwen3-0.6B bs=1 step and of a Qwen3-30B-A3B
# bs=1 step), the bench itself.
START=$(date +%s); left() { echo $(( 420 - ($(date +%s) - START) )); }
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
S=$OUT/summary.txt; L=/tmp/logs; rm -rf $L; mkdir -p $L; : > $S
fin() { for f in ncu_mid ncu_tail ncu_q06_bs1 ncu_30b_bs1; do [ -f $L/$f.csv ] && python3 scripts/gpu/ncu_table.py $L/$f.csv $f > $L/$f.table.txt 2>&1; done
  cat $L/*.table.txt >> $S 2>/dev/null; cat $L/attn.txt >> $S 2>/dev/null; cp $S $L/; tar czf $OUT/logs.tgz -C /tmp logs; }
trap fin EXIT
M="--metrics gpu__time_duration.sum,dram__bytes.sum --csv --clock-control none"
# 1. kernel tests on the sm_90a build, in parallel
# (the kernel tests run in call 2, on the merged build)
# 2. decode attention (the bench's shapes included)
timeout 150 $BIN/benches/minisgl-attention decode --bench --warm-up-time 0.1 --measurement-time 0.2 2>&1 | grep SUMMARY > $L/attn.txt; echo "attn rc=$?" >> $S
# 3. the bench
mkdir -p /tmp/q06; cp tests/configs/qwen3-0.6b/config.json /tmp/q06/; cp tests/fixtures/qwen3-tiny/tokenizer* /tmp/q06/
timeout 60 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $L/bench.log 2>&1
grep -E "output throughput|^time|steps" $L/bench.log | tr '\n' ' ' >> $S; echo >> $S
echo "before ncu: $(left) s left" >> $S
# 4. ncu: one bench decode step mid-run and one in the tail (eager), a Qwen3 bs=1 step, a 30B bs=1 step
[ $(left) -gt 60 ] && timeout $(( $(left) < 170 ? $(left) - 10 : 170 )) ncu $M --launch-skip 120000 --launch-count 330 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 --disable-cuda-graph > $L/ncu_mid.csv 2>&1; echo "ncu mid rc=$?" >> $S
[ $(left) -gt 60 ] && timeout 100 ncu $M --launch-skip 3000 --launch-count 320 $T/models-gpu_dummy qwen3_0_6b_dummy_decode_bs1 --test-threads=1 > $L/ncu_q06_bs1.csv 2>&1; echo "ncu q06 rc=$?" >> $S
[ $(left) -gt 60 ] && timeout $(( $(left) < 150 ? $(left) - 10 : 150 )) ncu $M --launch-skip 6000 --launch-count 640 $T/models-gpu_dummy qwen3_30b_a3b_dummy_decode_bs1 --test-threads=1 > $L/ncu_30b_bs1.csv 2>&1; echo "ncu 30b rc=$?" >> $S
echo "end" >> $S
