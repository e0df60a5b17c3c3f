#!/bin/bash
# Twenty-sixth session, call C (the probes of call B): tile 46 against 47 (46
# persistent, two Q buffers, static rounds; a copy of the kernel with that table
# entry) over more batch shapes, for the rule that would choose 47 (call B: 47 ahead
# at b=8 L=1024 and b=16 L=512, behind at b=1 L=4096 and b=3 L=1000).
START=$(date +%s)
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
trap 'cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w' EXIT
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
tar xJf .gpu/probe.tar.xz -C .gpu
CASES="32 8 8 1024 16 32 8 16 512 16 32 8 32 256 16 32 8 4 2048 16 32 8 2 2048 16 32 8 6 1536 16 32 8 12 768 16 16 8 8 1024 16 16 8 16 512 16 8 8 8 1024 16 32 8 64 128 16 32 8 24 600 16"
for r in 1 2; do for tl in 46 47; do
  timeout 60 .gpu/probe/prefill_probe_rk_T$tl $CASES > $W/$tl-$r.log 2>&1; echo "round $r T$tl rc=$? ($(( $(date +%s) - START )) s)" >> $S
  grep -E "^SUMMARY" $W/$tl-$r.log >> $S
done; done
