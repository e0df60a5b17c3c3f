#!/bin/bash
# Twenty-seventh session, call A (bundle of 1b7f1ac; probes built from d2f7335's
# kernel: tile 48, 47 drawing its items from a counter). A short call while the
# bundle of tile 48 builds: probes of 46, 47, 48 at the shapes of the many-blocks
# rule (two rounds), 17 and 48 below 512 keys, torch SDPA's prefill figures. On an
# H200 every open H200 figure first (2026-12-06-s22-h200.sh).
BUDGET=${BUDGET:-300}
START0=$(date +%s)
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  BUDGET=420 PREFILL_TILES=17,39,46,47 bash .gpu/2026-12-06-s22-h200.sh
  cp $OUT/summary.txt $OUT/h200.txt; cp $OUT/logs.tgz $OUT/h200-logs.tgz 2>/dev/null
  BUDGET=$(( BUDGET + 170 - ($(date +%s) - START0) ))
fi
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
tar xJf .gpu/probe.tar.xz -C .gpu
CASES="32 8 8 1024 16 32 8 16 512 16 32 8 32 256 16 32 8 64 128 16 32 8 12 768 16 32 8 24 600 16 32 8 6 1536 16 32 8 4 2048 16 32 8 2 2048 16 32 8 3 1000 16 16 8 8 1024 16 32 8 1 4096 16"
SMALL="32 8 32 256 16 32 8 64 128 16 32 8 16 512 16 16 8 32 256 16 32 8 48 256 16 32 8 128 100 16 16 8 64 200 16"
for r in 1 2; do for tl in 46 47 48; do
  [ $(left) -lt 60 ] && break
  timeout 60 .gpu/probe/prefill_probe_rk_T$tl $CASES > $W/p$tl-$r.log 2>&1; echo "round $r T$tl rc=$? ($(( $(date +%s) - START )) s)" >> $S
  grep -E "^SUMMARY" $W/p$tl-$r.log >> $S
done
[ $r = 1 ] && for tl in 17 48; do
  timeout 40 .gpu/probe/prefill_probe_rk_T$tl $SMALL > $W/ps$tl.log 2>&1; echo "T$tl small rc=$? ($(( $(date +%s) - START )) s)" >> $S
  grep -E "^SUMMARY" $W/ps$tl.log >> $S
done; done
[ $(left) -gt 45 ] && { PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
  echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S; }
cat $OUT/h200.txt >> $S 2>/dev/null
echo "end at $(( $(date +%s) - START0 )) s" >> $S
