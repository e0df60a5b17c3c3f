#!/bin/bash
# Twenty-ninth session, call A (bundle of 2c06cd9's code, ABI 12). On an H200: every
# open H200 figure (2026-12-06-s22-h200.sh, prefill tiles 17, 39 and 48). On any other
# card: the twenty-eighth session's call A (the prefill ranking of up to 256 prompts,
# the tile-48 default at engine level, the bench, the b=256 L=64 burst), then where
# `minisgl bench`'s GPU time goes, kernel by kernel over the whole run (a kernel
# timeline of the bench itself: idle time, each kernel name's share, the busiest
# graphs' layers), then the Qwen3-30B-A3B and Qwen3-0.6B graphed steps' timelines.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  PREFILL_TILES=17,39,48 exec bash .gpu/2026-12-06-s22-h200.sh
fi
BUDGET=${BUDGET:-540}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
t 60 matches $T/kernel-runtime-gpu_prefill prefill_attention_gpu_matches_cpu --test-threads=1
t 90 search $T/kernel-runtime-gpu_prefill prefill_attention_gpu_item_search --test-threads=1
t 60 walks $T/kernel-runtime-gpu_prefill prefill_attention_gpu_persistent_walks --test-threads=1
t 50 fixtures $T/models-gpu_fixtures --test-threads=1
t 80 overlap $T/engine-gpu_overlap --test-threads=1
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/mbench.log 2>&1
echo "mbench rc=$? $(grep -E 'output throughput|^time|steps' $W/mbench.log | tr '\n' ' ')" >> $S
[ -e .gpu/libcupti.so.13.xz ] && xz -dkf .gpu/libcupti.so.13.xz
# The bench under the kernel timeline: the whole run's account, then the layers of
# the three graphs with the most GPU time.
if [ $(left) -gt 100 ]; then
  CUDA_INJECTION64_PATH=$ROOT/.gpu/libkernel_timeline.so MINISGL_TIMELINE=$W/tl-bench.csv \
    timeout 80 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/tl-bench.log 2>&1
  echo "timeline bench rc=$? $(grep -E 'output throughput' $W/tl-bench.log)" >> $S
  grep -iE 'decode .*rows|prefill .*steps' $W/tl-bench.log | head -8 >> $S
  python3 scripts/gpu/timeline_table.py $W/tl-bench.csv --whole --label bench > $W/tl-bench-whole.txt 2>&1
  cat $W/tl-bench-whole.txt >> $S
  for g in $(awk '/SUMMARY whole bench graph/ && $5 != "0:" {sub(":","",$5); print $5}' $W/tl-bench-whole.txt | head -3); do
    python3 scripts/gpu/timeline_table.py $W/tl-bench.csv --graph $g --layer 7,2 --label "bench" 2>&1 | grep -E "graph $g:|layer|by name" | head -24 >> $S
  done
  rm -f $W/tl-bench.csv
fi
MINISGL_BENCH_ATTENTION_FILTER="b=256 L=64" MINISGL_BENCH_PREFILL_TILES=17,48 bench 50 attn-burst $BB/minisgl-attention prefill
timeline qwen3_30b_a3b_graph_step_time_gpu 9,2
timeline qwen3_0_6b_graph_step_time_gpu 7,2
echo "end at $(( $(date +%s) - START )) s" >> $S
