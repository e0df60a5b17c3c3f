#!/bin/bash
# Seventh session, call 2 (commit 9d91ec3 and later: key tiles before the grid
# dependency wait, the eager stage choice, decode rows longest first): the GPU
# tests those changes touch, decode attention at the issue-12 shapes with the new
# defaults, the decode steps (graphs), the bench, torch SDPA in the same run.
START=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - START) )); }
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
A="--bench --warm-up-time 0.1 --measurement-time 0.2"
# 1. tests: the decode kernel beside the engines, one engine at a time
t 150 decode $T/kernel-runtime-gpu_decode --test-threads=1 &
t 90 fixtures $T/models-gpu_fixtures --test-threads=1
t 90 replay $T/engine-gpu_graphs graph_replay_equals_eager --test-threads=1
t 120 overlap $T/engine-gpu_overlap --test-threads=1
t 90 extras $T/engine-gpu_extras --test-threads=1
wait
echo "tests done at $(( $(date +%s) - START )) s" >> $S
# 2. decode attention, defaults (the eager plan's stage choice), and batch 1's graph plan
timeout 60 $BB/minisgl-attention "decode 32|decode 16|decode-graph" $A 2>&1 | grep SUMMARY | grep -v decode-tile >> $S; echo "attn $(left) s left" >> $S
# 3. steps (graphs) and the bench
step() { local name=$1; shift; [ $(left) -lt 60 ] && return; timeout 100 $T/engine-gpu_graphs $1 --test-threads=1 --nocapture 2>&1 | grep SUMMARY | sed "s/^/$name /" >> $S; }
step q06 qwen3_0_6b_graph_step_time
step l8b llama3_8b_graph_step_time
[ $(left) -gt 40 ] && { timeout 40 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench.log 2>&1; echo "bench rc=$? $(grep -E 'output throughput|^time' $W/bench.log | tr '\n' ' ')" >> $S; grep -E "^  (decode|prefill)" $W/bench.log >> $S; }
step 30b qwen3_30b_a3b_graph_step_time
# 4. torch SDPA (decode over contiguous K/V) in the same run
[ $(left) -gt 30 ] && { PYTHONUNBUFFERED=1 timeout $(( $(left) - 5 )) python3 scripts/gpu/torch_baselines.py > $W/torch.log 2>&1; echo "torch rc=$?" >> $S; grep SUMMARY $W/torch.log | head -24 >> $S; }
echo "end at $(( $(date +%s) - START )) s" >> $S
