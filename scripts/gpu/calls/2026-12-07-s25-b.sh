#!/bin/bash
# Twenty-fifth session, call B: the prefill probe again, with the TMA copies dealt to
# the producer's four warps (mw_*) against the one-warp producer (old_*), the
# producer's own timeline points, and page sizes 16/64/128.
BUDGET=${BUDGET:-200}
START=$(date +%s); left() { echo $(( BUDGET - ($(date +%s) - START) )); }
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
trap 'cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
P=.gpu/probe/prefill_probe
for b in .gpu/probe/prefill_probe_*; do
  [ "$(left)" -lt 40 ] && { echo "$b skipped" >> $S; continue; }
  timeout 40 "$b" > $W/$(basename $b).log 2>&1; echo "$(basename $b) rc=$? ($(( $(date +%s) - START )) s)" >> $S
  grep -E "^(SUMMARY|TIMELINE)" $W/$(basename $b).log >> $S
done
for v in mw old mwnosm; do for pg in 64 128; do
  timeout 30 ${P}_${v}_T28 32 8 1 4096 $pg 32 8 8 1024 $pg > $W/$v-page$pg.log 2>&1
  echo "$v page $pg rc=$?" >> $S; grep -E "^(SUMMARY|TIMELINE)" $W/$v-page$pg.log >> $S
done; done
PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
echo "end at $(( $(date +%s) - START )) s" >> $S
