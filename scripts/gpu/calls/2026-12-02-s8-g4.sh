#!/bin/bash
# Eighth session, call 4 (stream_gemm: one 3-D tensor copy a stage of each row's whole
# chunk, 1024-wide stages by default): its tests, the GEMM bench, the Llama-3-8B step
# with the streaming path on and off (and with PDL off), ncu of an eager Llama-3-8B bs=1
# step with it on and off.
START=$(date +%s); left() { echo $(( ${BUDGET:-420} - ($(date +%s) - START) )); }
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests; BB=$BIN/benches
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
fin() { for f in ncu_on ncu_off; do [ -f $W/$f.csv ] && python3 scripts/gpu/ncu_table.py $W/$f.csv $f > $W/$f.table.txt 2>&1 && head -16 $W/$f.table.txt >> $S; done; cat $W/t-*.sum >> $S 2>/dev/null; cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w; }
trap fin EXIT
t() { local to=$1 name=$2; shift 2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 10 ] && { echo "$name skipped" > $W/t-$name.sum; return; }
  timeout $to "$@" > $W/$name.log 2>&1; echo "$name rc=$? $(grep -E '^test result' $W/$name.log | tail -1) ($(( $(date +%s) - START )) s)" > $W/t-$name.sum; grep -E 'panicked|FAILED|failed:|error' $W/$name.log | head -12 >> $W/t-$name.sum; }
t 120 stream $T/kernel-runtime-gpu_stream_gemm --test-threads=1
cat $W/t-stream.sum >> $S
G="--bench --warm-up-time 0.1 --measurement-time 0.2"
for sh in llama3-8b qwen3-30b; do
  MINISGL_GEMM_BENCH_SHAPES=$sh timeout 120 $BB/minisgl-gemm $G 2>&1 | grep -E "SUMMARY|failed" | grep -E "m=(1|16) |failed" | grep -E "cublaslt|linear:|stream|skinny1:|failed" >> $S
done
echo "gemm $(left) s left" >> $S
step() { local name=$1; shift; [ $(left) -lt 60 ] && return; timeout 100 $T/engine-gpu_graphs $1 --test-threads=1 --nocapture 2>&1 | grep SUMMARY | sed "s/^/$name /" >> $S; }
step l8b llama3_8b_graph_step_time
( export MINISGL_STREAM_GEMM=0; step l8b-nostream llama3_8b_graph_step_time )
( export MINISGL_STREAM_STAGES=2; step l8b-st2 llama3_8b_graph_step_time )
( export MINISGL_STREAM_CHUNK=512 MINISGL_STREAM_STAGES=4; step l8b-ch512st4 llama3_8b_graph_step_time )
( export MINISGL_PDL=0; step l8b-nopdl llama3_8b_graph_step_time )
( export MINISGL_PDL=0 MINISGL_STREAM_GEMM=0; step l8b-nopdl-nostream llama3_8b_graph_step_time )
M="--metrics gpu__time_duration.sum,dram__bytes.sum --csv --clock-control none"
[ $(left) -gt 60 ] && timeout 80 ncu $M --launch-skip 3000 --launch-count 300 $T/models-gpu_dummy llama3_8b_dummy_decode_bs1 --test-threads=1 > $W/ncu_on.csv 2>&1
[ $(left) -gt 60 ] && MINISGL_STREAM_GEMM=0 timeout 80 ncu $M --launch-skip 3000 --launch-count 300 $T/models-gpu_dummy llama3_8b_dummy_decode_bs1 --test-threads=1 > $W/ncu_off.csv 2>&1
echo "end at $(( $(date +%s) - START )) s" >> $S
