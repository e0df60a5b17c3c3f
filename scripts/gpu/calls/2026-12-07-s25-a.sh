#!/bin/bash
# Twenty-fifth session, call A: the prefill probe (scripts/gpu/prefill_probe.cu, built
# by build_prefill_probe.sh into .gpu/probe/): each tile variant timed alone beside
# torch SDPA, checked against the naive kernel, with the per-block timeline.
BUDGET=${BUDGET:-240}
START=$(date +%s); left() { echo $(( BUDGET - ($(date +%s) - START) )); }
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
trap 'cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
for b in .gpu/probe/prefill_probe_*; do
  [ "$(left)" -lt 40 ] && { echo "$b skipped" >> $S; continue; }
  timeout 40 "$b" > $W/$(basename $b).log 2>&1; echo "$(basename $b) rc=$? ($(( $(date +%s) - START )) s)" >> $S
  grep -E "^(SUMMARY|TIMELINE)" $W/$(basename $b).log >> $S
done
for pg in 64 128; do
  timeout 30 .gpu/probe/prefill_probe_base_T28 32 8 1 4096 $pg 32 8 8 1024 $pg > $W/page$pg.log 2>&1
  echo "page $pg rc=$?" >> $S; grep -E "^(SUMMARY|TIMELINE)" $W/page$pg.log >> $S
done
PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
echo "end at $(( $(date +%s) - START )) s" >> $S
