#!/bin/bash
# Twenty-seventh session, call A (bundle of 1b7f1ac: tile 47 AOT, behind
# MINISGL_PREFILL_MANY_TILE=1; probes built from the working tree with tile 48, 47
# drawing its items from a counter). On an H200, every open H200 figure first
# (2026-12-06-s22-h200.sh). Then the prefill tests with 47 in the lists, fixtures,
# probes of 46/47/48 (and 17, 39 where they are the rule's) on the shapes of the
# rule, the attention bench (Auto with MINISGL_PREFILL_MANY_TILE=1; 17, 39, 46, 47)
# beside torch SDPA, the Qwen3-0.6B bench.
BUDGET=${BUDGET:-585}
START0=$(date +%s)
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  BUDGET=$(( BUDGET - 200 )) PREFILL_TILES=17,39,46,47 bash .gpu/2026-12-06-s22-h200.sh
  cp $OUT/summary.txt $OUT/h200.txt; cp $OUT/logs.tgz $OUT/h200-logs.tgz 2>/dev/null
  H200=1; BUDGET=$(( BUDGET - ($(date +%s) - START0) ))
fi
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
tar xJf .gpu/probe.tar.xz -C .gpu
# The probes first (they need no bundle state): 46, 47, 48 at the rule's shapes.
CASES="32 8 8 1024 16 32 8 16 512 16 32 8 32 256 16 32 8 64 128 16 32 8 12 768 16 32 8 24 600 16 32 8 6 1536 16 32 8 4 2048 16 32 8 2 2048 16 32 8 3 1000 16 16 8 8 1024 16 32 8 1 4096 16"
for r in 1 2; do for tl in 46 47 48; do
  [ $(left) -lt 200 ] && break
  timeout 60 .gpu/probe/prefill_probe_rk_T$tl $CASES > $W/p$tl-$r.log 2>&1; echo "round $r T$tl rc=$? ($(( $(date +%s) - START )) s)" >> $S
  grep -E "^SUMMARY" $W/p$tl-$r.log >> $S
done; done
SMALL="32 8 32 256 16 32 8 64 128 16 32 8 16 512 16 16 8 32 256 16 32 8 48 256 16 32 8 128 100 16 16 8 64 200 16"
timeout 40 .gpu/probe/prefill_probe_rk_T17 $SMALL > $W/p17.log 2>&1; echo "T17 small rc=$? ($(( $(date +%s) - START )) s)" >> $S
grep -E "^SUMMARY" $W/p17.log >> $S
timeout 40 .gpu/probe/prefill_probe_rk_T48 $SMALL > $W/p48s.log 2>&1; echo "T48 small rc=$? ($(( $(date +%s) - START )) s)" >> $S
grep -E "^SUMMARY" $W/p48s.log >> $S
export MINISGL_TEST_PREFILL_TILES=17,39,46,47
t 60 matches $T/kernel-runtime-gpu_prefill prefill_attention_gpu_matches_cpu --test-threads=1
t 60 wg_long $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_long --test-threads=1
t 120 wg_tiles $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_tiles --test-threads=1
t 60 search $T/kernel-runtime-gpu_prefill prefill_attention_gpu_item_search --test-threads=1
MINISGL_TEST_PREFILL_TILES=35,47 t 90 walks $T/kernel-runtime-gpu_prefill prefill_attention_gpu_persistent_walks --test-threads=1
t 60 fixtures $T/models-gpu_fixtures --test-threads=1
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
if [ -z "$H200" ]; then
  MINISGL_PREFILL_MANY_TILE=1 MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=39,46,47 bench 90 attn-prefill $BB/minisgl-attention prefill
  PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
  echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
  timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/mbench.log 2>&1
  echo "mbench rc=$? $(grep -E 'output throughput|^time' $W/mbench.log | tr '\n' ' ')" >> $S
else
  cat $OUT/h200.txt >> $S
fi
echo "end at $(( $(date +%s) - START0 )) s" >> $S
