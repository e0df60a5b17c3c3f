#!/bin/bash
# Call 1 (fifth session): the bounded PDL protocol (fuse re-applied), step times, bench, profiles.
MINISGL_GPU_STEPS=info bash .gpu/run.sh >/dev/null 2>&1
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
S=$OUT/summary.txt
ls $T > $OUT/bins.txt; ls $BIN/benches >> $OUT/bins.txt
t() { local name=$1; shift; timeout 300 "$@" > $OUT/$name.log 2>&1; echo "$name rc=$? $(grep -E '^test result' $OUT/$name.log | tail -1)" >> $S; grep -E 'SUMMARY|panicked|FAILED' $OUT/$name.log | head -40 >> $S; }
# 1. correctness of the bounded protocol: the test that failed with the unbounded one, twice
t overlap1 $T/engine-gpu_overlap --test-threads=1
t overlap2 $T/engine-gpu_overlap overlap_equals_no_overlap_qwen3_0_6b --test-threads=1
t graphs_replay $T/engine-gpu_graphs graph_replay --test-threads=1
t fused $T/kernel-runtime-gpu_fused --test-threads=1
t fixtures $T/models-gpu_fixtures --test-threads=1
# 2. step times (graphed and eager), defaults and PDL off
t steps_q $T/engine-gpu_graphs qwen3_0_6b_graph_step_time --test-threads=1 --nocapture
t steps_l $T/engine-gpu_graphs llama3_8b_graph_step_time --test-threads=1 --nocapture
MINISGL_PDL=0 t steps_q_nopdl $T/engine-gpu_graphs qwen3_0_6b_graph_step_time --test-threads=1 --nocapture
MINISGL_SKINNY_PREFETCH=0 t steps_q_nopre $T/engine-gpu_graphs qwen3_0_6b_graph_step_time --test-threads=1 --nocapture
# 3. bench
mkdir -p /tmp/q06 /tmp/l8; cp tests/configs/qwen3-0.6b/config.json /tmp/q06/; cp tests/fixtures/qwen3-tiny/tokenizer* /tmp/q06/
cp tests/configs/llama3-8b/config.json /tmp/l8/; cp tests/fixtures/qwen3-tiny/tokenizer* /tmp/l8/
for i in 1 2; do timeout 120 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $OUT/bench_q$i.log 2>&1; echo "bench q06 $i rc=$? $(grep -iE 'tok/s' $OUT/bench_q$i.log | tail -2 | tr '\n' ' ')" >> $S; done
timeout 120 $BIN/minisgl bench --model /tmp/l8 --load-format dummy --device cuda --vocab-size 128000 > $OUT/bench_l8.log 2>&1; echo "bench l8 rc=$? $(grep -iE 'tok/s' $OUT/bench_l8.log | tail -2 | tr '\n' ' ')" >> $S
# 4. profiles for the helpers: prefill tile kernel, decode kernel at b=64 ctx=2048
SEC="--section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats --section ComputeWorkloadAnalysis"
timeout 150 ncu --clock-control none -k regex:attention_kernel --launch-skip 5 --launch-count 1 $SEC $BIN/benches/attention --bench "prefill 32/8 b=1 L=4096" --warm-up-time 0.2 --measurement-time 0.2 > $OUT/ncu_prefill.txt 2>&1; echo "ncu prefill rc=$?" >> $S
timeout 150 ncu --clock-control none -k regex:decode_attention_kernel --launch-skip 5 --launch-count 1 $SEC $BIN/benches/attention --bench "decode 32/8 page=16 b=64 ctx=2048" --warm-up-time 0.2 --measurement-time 0.2 > $OUT/ncu_decode.txt 2>&1; echo "ncu decode rc=$?" >> $S
cat $S
