#!/bin/bash
# Twenty-fifth session, call D: the probe's timeline with store-only stamps (the
# producer's start too), the search's floor (nofind_*: equal prompts computed, not
# searched), and shorter prompts for the TMA tiles' threshold (17 against 39 and 35).
BUDGET=${BUDGET:-200}
START=$(date +%s); left() { echo $(( BUDGET - ($(date +%s) - START) )); }
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
trap 'cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
P=.gpu/probe/prefill_probe
for b in .gpu/probe/prefill_probe_*; do
  timeout 40 "$b" > $W/$(basename $b).log 2>&1; echo "$(basename $b) rc=$? ($(( $(date +%s) - START )) s)" >> $S
  grep -E "^(SUMMARY|TIMELINE)" $W/$(basename $b).log | grep -v per-tile >> $S
done
for t in 17 35 39; do
  timeout 40 ${P}_ff_T$t 32 8 4 2048 16 32 8 16 512 16 32 8 32 256 16 32 8 2 1024 16 > $W/short$t.log 2>&1
  echo "short T$t rc=$?" >> $S; grep -E "^SUMMARY" $W/short$t.log >> $S
done
PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
echo "end at $(( $(date +%s) - START )) s" >> $S
