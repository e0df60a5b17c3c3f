#!/bin/bash
# (Ran the L2 prefetch of commits 3c1c7ca / a8a6519, reverted after call 2: it made every
# bs=1 step slower; docs/PERF.md, ninth session.)
# Ninth session, call 2 (the L2 prefetch moved to a side stream forked from the compute
# stream): its tests, the tests the capture change reaches (graphs, fixtures, overlap), the
# graphed steps of the three models with the prefetch off / layer / attn (and at 64 rows),
# ncu of an eager Qwen3-0.6B bs=1 step with the prefetch (does the GEMM read L2?), the GEMM
# bench with weights hot in the L2 beside cold (the ceiling), the Qwen3 bench.
START=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - START) )); }
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests; BB=$BIN/benches
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
fin() { [ -f $W/ncu_q06.csv ] && python3 scripts/gpu/ncu_table.py $W/ncu_q06.csv ncu_q06_bs1_prefetch > $W/ncu_q06.table.txt 2>&1 && cat $W/ncu_q06.table.txt >> $S
  cat $W/t-*.sum >> $S 2>/dev/null; cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w; }
trap fin EXIT
t() { local to=$1 name=$2; shift 2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 10 ] && { echo "$name skipped" > $W/t-$name.sum; return; }
  timeout $to "$@" > $W/$name.log 2>&1; echo "$name rc=$? $(grep -E '^test result' $W/$name.log | tail -1) ($(( $(date +%s) - START )) s)" > $W/t-$name.sum; grep -E 'panicked|FAILED|failed:|error' $W/$name.log | head -12 >> $W/t-$name.sum; }
mkdir -p /tmp/q06; cp tests/configs/qwen3-0.6b/config.json /tmp/q06/; cp tests/fixtures/qwen3-tiny/tokenizer* /tmp/q06/
t 60 prefetch $T/kernel-runtime-gpu_l2_prefetch --test-threads=1 --nocapture
grep SUMMARY $W/prefetch.log >> $S
t 90 fixtures $T/models-gpu_fixtures --test-threads=1
t 100 graphs $T/engine-gpu_graphs --test-threads=1 --skip step_time
t 90 overlap $T/engine-gpu_overlap --test-threads=1
echo "tests done at $(( $(date +%s) - START )) s" >> $S
step() { local name=$1; shift; [ $(left) -lt 40 ] && { echo "$name skipped" >> $S; return; }; timeout 100 $T/engine-gpu_graphs $1 --test-threads=1 --nocapture 2>&1 | grep SUMMARY | sed "s/^/$name /" >> $S; }
for m in qwen3_0_6b llama3_8b qwen3_30b_a3b; do
  ( export MINISGL_L2_PREFETCH=0; step $m-off ${m}_graph_step_time )
  ( export MINISGL_L2_PREFETCH=layer; step $m-layer ${m}_graph_step_time )
  ( export MINISGL_L2_PREFETCH=attn; step $m-attn ${m}_graph_step_time )
  ( export MINISGL_L2_PREFETCH=layer MINISGL_L2_PREFETCH_ROWS=64; step $m-layer-r64 ${m}_graph_step_time )
done
( export MINISGL_L2_PREFETCH=0; step qwen3_0_6b-off-again qwen3_0_6b_graph_step_time )
( export MINISGL_L2_PREFETCH=layer; step qwen3_0_6b-layer-again qwen3_0_6b_graph_step_time )
echo "steps done at $(( $(date +%s) - START )) s" >> $S
for hot in 0 1; do for sh in "llama3-8b o" "llama3-8b qkv" "qwen3-0.6b"; do
  [ $(left) -lt 60 ] && break
  MINISGL_GEMM_BENCH_HOT=$hot MINISGL_GEMM_BENCH_SHAPES="$sh" timeout 60 $BB/minisgl-gemm --bench --warm-up-time 0.1 --measurement-time 0.2 2>&1 | grep SUMMARY | grep -v lm_head | grep -E "m=(1|16) " | grep -E "cublaslt|linear:|skinny1:|skinny-silu" | sed "s/^/hot=$hot /" >> $S
done; done
echo "gemm done at $(( $(date +%s) - START )) s" >> $S
[ $(left) -gt 40 ] && { timeout 40 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench.log 2>&1; echo "bench rc=$? $(grep -E 'output throughput|^time' $W/bench.log | tr '\n' ' ')" >> $S; }
M="--metrics gpu__time_duration.sum,dram__bytes.sum --csv --clock-control none"
[ $(left) -gt 60 ] && MINISGL_L2_PREFETCH=layer timeout $(( $(left) - 15 )) ncu $M --launch-skip 3000 --launch-count 340 $T/models-gpu_dummy qwen3_0_6b_dummy_decode_bs1 --test-threads=1 > $W/ncu_q06.csv 2>&1; echo "ncu rc=$?" >> $S
echo "end at $(( $(date +%s) - START )) s" >> $S
