#!/bin/bash
# Tenth session, call 2: batch-1 decode attention again. The cold bench with the graph
# plan at 1, 2 and 4 waves of blocks (MINISGL_DECODE_GRAPH_SPLIT_WAVES), the graphed steps
# at 1 wave, ncu stall sections of one batch-1 launch (graph plan and eager plan, 16/8
# ctx 512), and ncu per-kernel times of an eager Llama-3-8B bs=64 step.
START=$(date +%s); left() { echo $(( ${BUDGET:-560} - ($(date +%s) - START) )); }
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests; BB=$BIN/benches
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
fin() { cat $W/t-*.sum >> $S 2>/dev/null; [ -f $W/ncu_l8b64.csv ] && python3 scripts/gpu/ncu_table.py $W/ncu_l8b64.csv ncu_l8b_bs64 >> $S 2>&1; cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w; }
trap fin EXIT
t() { local to=$1 name=$2; shift 2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 10 ] && { echo "$name skipped" > $W/t-$name.sum; return; }
  timeout $to "$@" > $W/$name.log 2>&1; echo "$name rc=$? $(grep -E '^test result' $W/$name.log | tail -1) ($(( $(date +%s) - START )) s)" > $W/t-$name.sum; grep -E 'panicked|FAILED|failed:|error' $W/$name.log | head -12 >> $W/t-$name.sum; }
step() { local name=$1; shift; [ $(left) -lt 40 ] && { echo "$name skipped" >> $S; return; }; timeout 90 $T/engine-gpu_graphs $1 --test-threads=1 --nocapture 2>&1 | grep SUMMARY | sed "s/^/$name /" >> $S; }
( export MINISGL_BENCH_ATTENTION=cold; timeout 150 $BB/minisgl-attention --bench > $W/bench-attention.log 2>&1; echo "bench rc=$?" >> $S; grep SUMMARY $W/bench-attention.log | grep -v "stages=[34]" >> $S )
echo "bench done at $(( $(date +%s) - START )) s" >> $S
for r in 1 2; do
  for m in qwen3_0_6b llama3_8b; do
    step default-$r ${m}_graph_step_time
    ( export MINISGL_DECODE_GRAPH_SPLIT_WAVES=1; step gw1-$r ${m}_graph_step_time )
  done
done
echo "steps done at $(( $(date +%s) - START )) s" >> $S
N="ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis -k regex:decode_attention --launch-skip 8 --launch-count 2"
( export MINISGL_BENCH_ATTENTION=cold MINISGL_BENCH_ATTENTION_FILTER="stages=2 waves=2 splits=99 combine 16/8 ctx=512"; timeout 90 $N $BB/minisgl-attention --bench > $W/ncu-b1-graph.log 2>&1; echo "ncu b1 graph rc=$?" >> $S )
( export MINISGL_BENCH_ATTENTION=cold MINISGL_BENCH_ATTENTION_FILTER="eager 16/8 ctx=512"; timeout 90 $N $BB/minisgl-attention --bench > $W/ncu-b1-eager.log 2>&1; echo "ncu b1 eager rc=$?" >> $S )
echo "ncu b1 done at $(( $(date +%s) - START )) s" >> $S
M="--metrics gpu__time_duration.sum,dram__bytes.sum --csv --clock-control none"
timeout $(( $(left) - 15 )) ncu $M --launch-skip 3000 --launch-count 240 $T/models-gpu_dummy llama3_8b_dummy_decode_bs64 --test-threads=1 > $W/ncu_l8b64.csv 2>&1; echo "ncu l8b64 rc=$? at $(( $(date +%s) - START )) s" >> $S
