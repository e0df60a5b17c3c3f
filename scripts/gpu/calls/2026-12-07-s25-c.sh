#!/bin/bash
# Twenty-fifth session, call C: the prefill probe with the batch layout read once
# (ff_*: prefill_find_tile on registers, the first pages read before Q) against call
# B's four-warp producer (mw_*) and the one-warp producer (old_*).
BUDGET=${BUDGET:-200}
START=$(date +%s); left() { echo $(( BUDGET - ($(date +%s) - START) )); }
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
trap 'cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
for b in .gpu/probe/prefill_probe_*; do
  [ "$(left)" -lt 40 ] && { echo "$b skipped" >> $S; continue; }
  timeout 40 "$b" > $W/$(basename $b).log 2>&1; echo "$(basename $b) rc=$? ($(( $(date +%s) - START )) s)" >> $S
  grep -E "^(SUMMARY|TIMELINE)" $W/$(basename $b).log >> $S
done
PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
echo "end at $(( $(date +%s) - START )) s" >> $S
