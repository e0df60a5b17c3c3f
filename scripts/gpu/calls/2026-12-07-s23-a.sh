#!/bin/bash
# Twenty-third session, first call (bundle of 93d0e5b). On an H200: the persistent
# walks and the CPU match of 4a2239a's producer first (the default long-prompt tile 27
# runs it), then every open H200 figure (s22-h200.sh) in what is left. Elsewhere the
# s22 g4 sequence (walks, matches, overlapped tiles, prefill bench beside SDPA, ncu).
TOTAL=${BUDGET:-570}; T0=$(date +%s)
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  BUDGET=$TOTAL exec bash .gpu/2026-12-06-s22-g4.sh
fi
( BUDGET=110; source .gpu/lib.sh
  G=$T/kernel-runtime-gpu_prefill
  t 80 walks $G prefill_attention_gpu_persistent_walks --test-threads=1
  t 30 matches $G prefill_attention_gpu_matches_cpu --test-threads=1 )
cp $OUT/summary.txt $OUT/pre.txt
BUDGET=$(( TOTAL - ($(date +%s) - T0) )) bash .gpu/2026-12-06-s22-h200.sh
cat $OUT/pre.txt
