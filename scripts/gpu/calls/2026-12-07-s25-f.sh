#!/bin/bash
# Twenty-fifth session, call F: call E's probe (any card), then, on an H200, every
# open H200 figure with the bundle of 500c733 (2026-12-06-s22-h200.sh, which stops
# on other cards). Summaries: $OUT/probe.txt, $OUT/summary.txt.
BUDGET=60 bash scripts/gpu/calls/2026-12-07-s25-e.sh
cp $OUT/summary.txt $OUT/probe.txt; cp $OUT/logs.tgz $OUT/probe-logs.tgz
BUDGET=${BUDGET:-420} PREFILL_TILES=17,28,39 bash .gpu/2026-12-06-s22-h200.sh
