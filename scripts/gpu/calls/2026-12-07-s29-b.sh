#!/bin/bash
# Twenty-ninth session, call B (bundle of the block-order commit, ABI 13): the decode
# kernel's blocks taking a ragged batch longest first (MINISGL_DECODE_ORDER=longest,
# off by default until this call). First correctness: the decode variants with the
# orders (bitwise equal to batch order), the graphed steps with the order on (replay
# = eager bit for bit), the overlapped engine with it; the prefill search past the
# ranking at the default tiles (call A ran it over every tile and ran out of time).
# Then the measurement: the cold graph-timed decode launches at the bench's batch
# sizes in drawn, longest-first and shortest-first order (and the one-kv-head
# layout case), and `minisgl bench` with the order off and on in alternating rounds.
BUDGET=${BUDGET:-540}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
MINISGL_BENCH_ATTENTION=cold MINISGL_BENCH_ATTENTION_FILTER=decode-order bench 70 order $BB/minisgl-attention
mb() { local label=$1; shift; [ $(left) -lt 30 ] && { echo "mbench $label skipped" >> $S; return; }
  env "$@" timeout 40 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/mbench-$label.log 2>&1
  echo "mbench $label rc=$? $(grep -E 'output throughput' $W/mbench-$label.log)" >> $S
  grep -E 'decode .*rows' $W/mbench-$label.log >> $S; }
mb batch1 MINISGL_DECODE_ORDER=batch
mb longest1 MINISGL_DECODE_ORDER=longest
mb batch2 MINISGL_DECODE_ORDER=batch
mb longest2 MINISGL_DECODE_ORDER=longest
t 100 decode $T/kernel-runtime-gpu_decode gpu_decode_variants_match_cpu_bf16 --test-threads=1
MINISGL_DECODE_ORDER=longest t 90 replay $T/engine-gpu_graphs graph_replay_equals_eager_step_gpu --test-threads=1
MINISGL_DECODE_ORDER=longest t 40 overlap $T/engine-gpu_overlap --test-threads=1
# The cache layout's share of the streaming rate (the thirteenth session's one-kv-head
# case, never run): 4/1 b=512 against 32/8 b=64 at 2048 keys, and batch 1 at 2048.
MINISGL_BENCH_ATTENTION=cold MINISGL_BENCH_ATTENTION_FILTER=ctx=2048 bench 45 layout $BB/minisgl-attention
MINISGL_TEST_PREFILL_TILES=39,48 t 60 search $T/kernel-runtime-gpu_prefill prefill_attention_gpu_item_search --test-threads=1
t 100 decode-rest $T/kernel-runtime-gpu_decode --skip gpu_decode_variants_match_cpu_bf16 --test-threads=1
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
echo "end at $(( $(date +%s) - START )) s" >> $S
