#!/bin/bash
# Ninth session, call 6 (the bundle of call 5): where the bs=1 step's time goes now, ncu
# per-kernel tables of one eager decode step of Qwen3-0.6B and of Llama-3-8B.
START=$(date +%s); left() { echo $(( ${BUDGET:-300} - ($(date +%s) - START) )); }
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
fin() { for f in q06 l8b; do [ -f $W/ncu_$f.csv ] && python3 scripts/gpu/ncu_table.py $W/ncu_$f.csv ncu_${f}_bs1 >> $S 2>&1; done; cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w; }
trap fin EXIT
M="--metrics gpu__time_duration.sum,dram__bytes.sum --csv --clock-control none"
timeout 120 ncu $M --launch-skip 3000 --launch-count 200 $T/models-gpu_dummy qwen3_0_6b_dummy_decode_bs1 --test-threads=1 > $W/ncu_q06.csv 2>&1; echo "ncu q06 rc=$?" >> $S
timeout $(( $(left) - 10 )) ncu $M --launch-skip 3000 --launch-count 230 $T/models-gpu_dummy llama3_8b_dummy_decode_bs1 --test-threads=1 > $W/ncu_l8b.csv 2>&1; echo "ncu l8b rc=$?" >> $S
echo "end at $(( $(date +%s) - START )) s" >> $S
