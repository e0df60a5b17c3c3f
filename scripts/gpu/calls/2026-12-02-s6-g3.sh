#!/bin/bash
# Sixth session, call 3 (the defaults of call 2: wgmma MoE and prefill tiles on sm_90, the
# pre-norm skinny variant with its shared-memory fix): every affected GPU test, step times,
# the benches beside torch SDPA and Triton.
START=$(date +%s); left() { echo $(( ${BUDGET:-540} - ($(date +%s) - START) )); }
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
# 1. kernel tests side by side, the engines one at a time beside them
t 200 prefill $T/kernel-runtime-gpu_prefill --test-threads=2 &
t 150 moe $T/kernel-runtime-gpu_moe --test-threads=2 &
t 150 fused $T/kernel-runtime-gpu_fused --test-threads=2 &
t 100 fixtures $T/models-gpu_fixtures --test-threads=1
t 100 replay $T/engine-gpu_graphs graph_replay_equals_eager --test-threads=1
t 100 overlap $T/engine-gpu_overlap --test-threads=1
t 120 dummy $T/models-gpu_dummy --test-threads=1
wait
echo "tests done at $(( $(date +%s) - START )) s" >> $S
# 2. step times (graphs), the bench
step() { local name=$1; shift; [ $(left) -lt 60 ] && return; timeout 100 env "${@:2}" $T/engine-gpu_graphs $1 --test-threads=1 --nocapture 2>&1 | grep SUMMARY | sed "s/^/$name /" >> $S; }
step q06 qwen3_0_6b_graph_step_time MINISGL_SKINNY_NORM=1
step l8b llama3_8b_graph_step_time MINISGL_SKINNY_NORM=1
step 30b qwen3_30b_a3b_graph_step_time MINISGL_SKINNY_NORM=1
qbench bench_q06 MINISGL_SKINNY_NORM=1
mkdir -p /tmp/q30; cp tests/configs/qwen3-30b-a3b/config.json /tmp/q30/; cp tests/fixtures/qwen3-tiny/tokenizer* /tmp/q30/
[ $(left) -gt 60 ] && { timeout 60 $BIN/minisgl bench --model /tmp/q30 --load-format dummy --device cuda --vocab-size 151643 > $W/bench30.log 2>&1; echo "bench30 rc=$? $(grep -E 'output throughput|^time' $W/bench30.log | tr '\n' ' ')" >> $S; }
# 3. the kernels beside torch and Triton in the same run
bench() { local to=$1 name=$2; shift 2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 15 ] && { echo "$name skipped" >> $S; return; }
  timeout $to "$@" --bench --warm-up-time 0.1 --measurement-time 0.2 > $W/$name.log 2>&1; echo "$name rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep -E '^SUMMARY' $W/$name.log >> $S; }
MINISGL_MOE_BENCH_TILES=none bench 40 moe $BB/minisgl-moe
[ $(left) -gt 30 ] && { PYTHONUNBUFFERED=1 timeout 30 python3 scripts/gpu/moe_triton_baseline.py > $W/triton.log 2>&1; echo "triton rc=$?" >> $S; grep SUMMARY $W/triton.log | head -12 >> $S; }
MINISGL_BENCH_PREFILL_TILES=0,16 bench 60 prefill $BB/minisgl-attention prefill
[ $(left) -gt 30 ] && { PYTHONUNBUFFERED=1 timeout $(( $(left) - 5 )) python3 scripts/gpu/torch_baselines.py > $W/torch.log 2>&1; echo "torch rc=$?" >> $S; grep SUMMARY $W/torch.log | head -20 >> $S; }
echo "end at $(( $(date +%s) - START )) s" >> $S
