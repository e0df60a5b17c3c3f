#!/bin/bash
# Twenty-sixth session, call B (bundle of the ranking's commit: the warp-specialised
# prefill tiles read each block's q tile from msgl_prefill_ranks; Q by TMA). On an
# H200, every open H200 figure first (2026-12-06-s22-h200.sh, which includes the
# attention bench and torch SDPA), then the prefill tests and the probe A/B. On any
# other card: the prefill tests (17, 39, 46; 35 walking; the item search), the probe
# A/B (the ranking against the search, PROBE_SEARCH=1, same binaries), the attention
# bench beside torch SDPA. Probe 47: 46 persistent (two Q buffers), built from a copy
# of the kernel with that table entry (not on main).
BUDGET=${BUDGET:-585}
START0=$(date +%s)
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  BUDGET=$(( BUDGET - 150 )) PREFILL_TILES=17,39,46 bash .gpu/2026-12-06-s22-h200.sh
  cp $OUT/summary.txt $OUT/h200.txt; cp $OUT/logs.tgz $OUT/h200-logs.tgz 2>/dev/null
  H200=1; BUDGET=$(( BUDGET - ($(date +%s) - START0) ))
fi
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
export MINISGL_TEST_PREFILL_TILES=17,39,46
t 60 matches $T/kernel-runtime-gpu_prefill prefill_attention_gpu_matches_cpu --test-threads=1
t 60 wg_long $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_long --test-threads=1
t 90 wg_tiles $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_tiles --test-threads=1
t 60 search $T/kernel-runtime-gpu_prefill prefill_attention_gpu_item_search --test-threads=1
MINISGL_TEST_PREFILL_TILES=35 t 60 walks $T/kernel-runtime-gpu_prefill prefill_attention_gpu_persistent_walks --test-threads=1
[ -z "$H200" ] && t 60 fixtures $T/models-gpu_fixtures --test-threads=1
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
tar xJf .gpu/probe.tar.xz -C .gpu
CASES="32 8 1 4096 16 32 8 8 1024 16 16 8 1 4096 16 32 8 16 512 16 32 8 3 1000 16 16 8 5 777 16"
for r in 1 2; do for tl in 39 46 47; do for mode in rank search; do
  if [ $mode = search ]; then export PROBE_SEARCH=1; else unset PROBE_SEARCH; fi
  [ $(left) -lt 20 ] && break
  timeout 40 .gpu/probe/prefill_probe_rk_T$tl $CASES > $W/$tl-$mode-$r.log 2>&1; echo "round $r T$tl $mode rc=$? ($(( $(date +%s) - START )) s)" >> $S
  grep -E "^(SUMMARY|TIMELINE producer)" $W/$tl-$mode-$r.log >> $S
done; done; done
unset PROBE_SEARCH
if [ -z "$H200" ]; then
  MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=17,39,46 bench 80 attn-prefill $BB/minisgl-attention prefill
  PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
  echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
else
  cat $OUT/h200.txt >> $S
fi
echo "end at $(( $(date +%s) - START0 )) s" >> $S
