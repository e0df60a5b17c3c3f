#!/bin/bash
# Twenty-eighth session, call A (prepared for a bundle of HEAD; not run in the
# twenty-eighth session: no device was lent). On an H200: every open H200 figure
# (2026-12-06-s22-h200.sh, prefill tiles 17, 39 and 48). On any other card: what
# the tile-48 default touches at engine level (the twenty-seventh session's call C),
# the prefill ranking of up to 256 prompts (ABI 12: item_search's batch past it, the
# ranked walks, the attention bench's b=256 L=64 burst), then the Qwen3-30B-A3B and
# Qwen3-0.6B graphed steps with their kernel timelines (where a bs=1 layer's time
# goes under today's defaults).
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
MINISGL_BENCH_ATTENTION_FILTER="b=256 L=64" MINISGL_BENCH_PREFILL_TILES=17,48 bench 50 attn-burst $BB/minisgl-attention prefill
timeline qwen3_30b_a3b_graph_step_time_gpu 9,2
timeline qwen3_0_6b_graph_step_time_gpu 7,2
echo "end at $(( $(date +%s) - START )) s" >> $S
