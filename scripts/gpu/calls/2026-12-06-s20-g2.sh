#!/bin/bash
# Twentieth session, call 2 (the bundle of call 1): tile 27, now the default for long
# runs at head dim 128, and 28 through the whole wgmma tile sweep (pages 1/16/64, head
# dims 64/128/256, bf16/f16, GQA 1..8, ragged, NaN past every key), then racecheck
# and synccheck over the TMA barrier protocol (tile 27, L=4096 and a chunk over a prefix).
BUDGET=${BUDGET:-420}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
t 220 wg_tiles env MINISGL_TEST_PREFILL_TILES=27,28 $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_tiles --test-threads=1
for tool in racecheck synccheck; do
  [ $(left) -lt 40 ] && break
  MINISGL_TEST_PREFILL_TILES=27 timeout $(( $(left) - 10 )) compute-sanitizer --tool $tool $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_long --test-threads=1 > $W/san-$tool.log 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' $W/san-$tool.log | tr '\n' ' ')" >> $S
done
echo "end at $(( $(date +%s) - START )) s" >> $S
