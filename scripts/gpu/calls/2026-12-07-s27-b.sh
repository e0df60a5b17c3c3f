#!/bin/bash
# Twenty-seventh session, call B (bundle of d2f7335 or later: tile 48, 47 drawing its
# items from a counter; probes of 46/47/48 and 17 from the same tree). On an H200,
# every open H200 figure first (2026-12-06-s22-h200.sh). Then: probes of 46, 47, 48
# at the shapes of the many-blocks rule (and 17 / 48 below 512 keys), the prefill tests
# of $TEST_TILES (46, 48: the producer loop changed for the warp-specialised tiles),
# the persistent walks of $WALK_TILES (48; the AOT launcher now caps their grid too),
# with FULL=1 the item search and the fixtures, the attention bench (Auto with
# MINISGL_PREFILL_MANY_TILE=1; 46, 48) beside torch SDPA; a second round of probes if
# time is left.
BUDGET=${BUDGET:-585}
START0=$(date +%s)
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  BUDGET=$(( BUDGET - 200 )) PREFILL_TILES=17,39,46,48 bash .gpu/2026-12-06-s22-h200.sh
  cp $OUT/summary.txt $OUT/h200.txt; cp $OUT/logs.tgz $OUT/h200-logs.tgz 2>/dev/null
  H200=1; BUDGET=$(( BUDGET - ($(date +%s) - START0) ))
fi
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
tar xJf .gpu/probe.tar.xz -C .gpu
CASES="32 8 8 1024 16 32 8 16 512 16 32 8 32 256 16 32 8 64 128 16 32 8 12 768 16 32 8 24 600 16 32 8 6 1536 16 32 8 4 2048 16 32 8 2 2048 16 32 8 3 1000 16 16 8 8 1024 16 32 8 1 4096 16"
SMALL="32 8 32 256 16 32 8 64 128 16 32 8 16 512 16 16 8 32 256 16 32 8 48 256 16 32 8 128 100 16 16 8 64 200 16"
probes() { for tl in 46 47 48; do
  [ $(left) -lt 150 ] && break
  timeout 60 .gpu/probe/prefill_probe_rk_T$tl $CASES > $W/p$tl-$1.log 2>&1; echo "round $1 T$tl rc=$? ($(( $(date +%s) - START )) s)" >> $S
  grep -E "^SUMMARY" $W/p$tl-$1.log >> $S
done; }
probes 1
for tl in 17 48; do
  timeout 40 .gpu/probe/prefill_probe_rk_T$tl $SMALL > $W/ps$tl.log 2>&1; echo "T$tl small rc=$? ($(( $(date +%s) - START )) s)" >> $S
  grep -E "^SUMMARY" $W/ps$tl.log >> $S
done
export MINISGL_TEST_PREFILL_TILES=${TEST_TILES:-46,48}
t 60 matches $T/kernel-runtime-gpu_prefill prefill_attention_gpu_matches_cpu --test-threads=1
t 60 wg_long $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_long --test-threads=1
t 100 wg_tiles $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_tiles --test-threads=1
MINISGL_TEST_PREFILL_TILES=${WALK_TILES:-48} t 100 walks $T/kernel-runtime-gpu_prefill prefill_attention_gpu_persistent_walks --test-threads=1
[ -n "$FULL" ] && t 60 search $T/kernel-runtime-gpu_prefill prefill_attention_gpu_item_search --test-threads=1
[ -n "$FULL" ] && t 50 fixtures $T/models-gpu_fixtures --test-threads=1
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
if [ -z "$H200" ]; then
  MINISGL_PREFILL_MANY_TILE=1 MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=46,48 bench 70 attn-prefill $BB/minisgl-attention prefill
  PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
  echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
  probes 2
else
  cat $OUT/h200.txt >> $S
fi
echo "end at $(( $(date +%s) - START0 )) s" >> $S
