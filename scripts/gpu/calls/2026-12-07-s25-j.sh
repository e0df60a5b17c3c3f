#!/bin/bash
# Twenty-fifth session, call J: where tile 46 (three consumers, 64-key tiles, three
# stages, the overlap) should take over from 39 and from 17: the probe at 32/8 b=4
# L=2048, b=32 L=256, b=64 L=128, b=4 L=1536 and 16/8 b=8 L=1024.
START=$(date +%s)
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
trap 'cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
tar xJf .gpu/probe.tar.xz -C .gpu
for b in .gpu/probe/prefill_probe_*; do
  timeout 40 "$b" 32 8 4 2048 16 32 8 32 256 16 32 8 64 128 16 32 8 4 1536 16 16 8 8 1024 16 > $W/$(basename $b).log 2>&1
  echo "$(basename $b) rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep -E "^SUMMARY" $W/$(basename $b).log >> $S
done
