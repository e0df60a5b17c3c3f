#!/bin/bash
# Twenty-seventh session, call C (bundle of e59a88a: tile 48 the default from 64 to
# 3071 keys at head dim 128). What the new default touches, under it: the prefill
# tests with the default rule (matches_cpu), the dense fixtures, the overlapped
# engine's outputs, the Qwen3-0.6B bench; with FULL=1 the attention bench's Auto
# beside torch SDPA too.
BUDGET=${BUDGET:-300}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
MINISGL_TEST_PREFILL_TILES=48 t 60 matches $T/kernel-runtime-gpu_prefill prefill_attention_gpu_matches_cpu --test-threads=1
t 50 fixtures $T/models-gpu_fixtures --test-threads=1
t 80 overlap $T/engine-gpu_overlap --test-threads=1
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
[ -n "$FULL" ] && MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=48 bench 60 attn-prefill $BB/minisgl-attention prefill
[ -n "$FULL" ] && { PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
  echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S; }
[ $(left) -gt 40 ] && { timeout $(( $(left) - 5 )) $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/mbench.log 2>&1
  echo "mbench rc=$? $(grep -E 'output throughput|^time' $W/mbench.log | tr '\n' ' ')" >> $S; }
echo "end at $(( $(date +%s) - START )) s" >> $S
