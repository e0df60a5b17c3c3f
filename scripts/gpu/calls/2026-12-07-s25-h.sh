#!/bin/bash
# Twenty-fifth session, calls H and I: the probe, at the bench shapes and shorter
# prompts, of whatever tiles .gpu/probe.tar.xz holds (H: 32, 33 (one consumer of 64
# rows, two blocks an SM), 30, 38 (three consumers) against 39; I: 44..46, which are
# 30 with three stages and/or the overlap) beside torch SDPA.
BUDGET=${BUDGET:-200}
START=$(date +%s)
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
trap 'cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
tar xJf .gpu/probe.tar.xz -C .gpu
for b in .gpu/probe/prefill_probe_*; do
  timeout 40 "$b" 32 8 1 4096 16 32 8 8 1024 16 16 8 1 4096 16 32 8 16 512 16 32 8 2 1024 16 > $W/$(basename $b).log 2>&1
  echo "$(basename $b) rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep -E "^SUMMARY" $W/$(basename $b).log >> $S
done
PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
