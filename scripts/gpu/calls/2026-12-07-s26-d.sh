#!/bin/bash
# Twenty-sixth session, call D (bundle of the tile-47 commit: 47 the default for many
# short blocks, 39/46/47 AOT at head dim 128 only). On an H200, every open H200 figure
# first (2026-12-06-s22-h200.sh, with the attention bench of 17, 39, 46, 47 and torch
# SDPA), then the prefill tests. Elsewhere: the prefill tests (17, 39, 46, 47; 35 and
# 47 walking; the item search), models-gpu_fixtures, the attention bench (Auto and 17,
# 39, 46, 47) beside torch SDPA, probes of 17, 46 and 47 below 512 keys, the
# Qwen3-0.6B bench.
BUDGET=${BUDGET:-585}
START0=$(date +%s)
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  BUDGET=$(( BUDGET - 170 )) PREFILL_TILES=17,39,46,47 bash .gpu/2026-12-06-s22-h200.sh
  cp $OUT/summary.txt $OUT/h200.txt; cp $OUT/logs.tgz $OUT/h200-logs.tgz 2>/dev/null
  H200=1; BUDGET=$(( BUDGET - ($(date +%s) - START0) ))
fi
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
export MINISGL_TEST_PREFILL_TILES=17,39,46,47
t 60 matches $T/kernel-runtime-gpu_prefill prefill_attention_gpu_matches_cpu --test-threads=1
t 60 wg_long $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_long --test-threads=1
t 120 wg_tiles $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_tiles --test-threads=1
t 60 search $T/kernel-runtime-gpu_prefill prefill_attention_gpu_item_search --test-threads=1
MINISGL_TEST_PREFILL_TILES=35,47 t 90 walks $T/kernel-runtime-gpu_prefill prefill_attention_gpu_persistent_walks --test-threads=1
t 60 fixtures $T/models-gpu_fixtures --test-threads=1
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
# Below the TMA tiles' 512-key floor: tile 17 (the default there) against 46 and 47.
tar xJf .gpu/probe.tar.xz -C .gpu
CASES="32 8 32 256 16 32 8 64 128 16 32 8 16 512 16 16 8 32 256 16 32 8 48 256 16 32 8 128 100 16 16 8 64 200 16"
for r in 1 2; do for tl in 17 46 47; do
  [ $(left) -lt 30 ] && break
  timeout 40 .gpu/probe/prefill_probe_rk_T$tl $CASES > $W/p$tl-$r.log 2>&1; echo "round $r T$tl rc=$? ($(( $(date +%s) - START )) s)" >> $S
  grep -E "^SUMMARY" $W/p$tl-$r.log >> $S
done; done
if [ -z "$H200" ]; then
  MINISGL_PREFILL_MANY_TILE=1 MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=17,39,46,47 bench 90 attn-prefill $BB/minisgl-attention prefill
  PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
  echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
  timeout 60 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/mbench.log 2>&1
  echo "mbench rc=$? $(grep -E 'output throughput|^time' $W/mbench.log | tr '\n' ' ')" >> $S
else
  cat $OUT/h200.txt >> $S
fi
echo "end at $(( $(date +%s) - START0 )) s" >> $S
