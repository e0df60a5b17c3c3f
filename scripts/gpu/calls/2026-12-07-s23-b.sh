#!/bin/bash
# Twenty-third session, second call (bundle of the tile-28 default and tile 39):
# correctness of the new default and the new tile first (the CPU match, the long
# tests and the tile tests of 28, 35 and 39; 28 and 35 are 64-key tiles without the
# overlap at head dim 256 now), then the prefill bench (Auto, which takes 28 for the
# L=4096 cases, beside 17, 27, 28 and 39) and torch SDPA in the same call, an ncu of
# tile 39 at 32/8 b=1 L=4096 with what is left.
BUDGET=${BUDGET:-330}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
G=$T/kernel-runtime-gpu_prefill
t 40 matches $G prefill_attention_gpu_matches_cpu --test-threads=1
t 70 wg_long env MINISGL_TEST_PREFILL_TILES=28,39 $G prefill_attention_gpu_wgmma_long --test-threads=1
t 80 wg_tiles env MINISGL_TEST_PREFILL_TILES=28,35,39 $G prefill_attention_gpu_wgmma_tiles --test-threads=1
TILES=17,27,28,39
MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=$TILES timeout $(( $(left) > 130 ? 110 : $(left) - 20 )) $BB/minisgl-attention "prefill" --bench --warm-up-time 0.1 --measurement-time 0.25 > $W/bench.log 2>&1
echo "bench rc=$? tiles $TILES ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/bench.log >> $S
[ $(left) -gt 40 ] && { PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
  echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S; }
ncu_prefill 39 "32/8 b=1 L=4096"
echo "end at $(( $(date +%s) - START )) s" >> $S
