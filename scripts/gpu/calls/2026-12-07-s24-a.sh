#!/bin/bash
# Twenty-fourth session, call A (bundle of tiles 41, 42 and 43: 28, 35 and 29 in
# FlashAttention-3's order, and every wgmma tile's descriptors in uniform registers).
# On any card: correctness of 28 and 41..43 (the long tests, the tile tests at head
# dims 64/128/256, the persistent walks of 42, the CPU match), then the prefill bench
# of 17, 28, 35 and 41..43 beside torch SDPA; with what is left an ncu of tile 41 at
# 32/8 b=1 L=4096. The H200 figures go in a call of their own (s23-h200.sh) right
# after, on an H200.
BUDGET=${BUDGET:-330}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
G=$T/kernel-runtime-gpu_prefill
t 60 wg_long env MINISGL_TEST_PREFILL_TILES=28,41,42,43 $G prefill_attention_gpu_wgmma_long --test-threads=1
t 60 wg_tiles env MINISGL_TEST_PREFILL_TILES=41,42,43 $G prefill_attention_gpu_wgmma_tiles --test-threads=1
t 40 walks env MINISGL_TEST_PREFILL_TILES=42 $G prefill_attention_gpu_persistent_walks --test-threads=1
t 30 matches $G prefill_attention_gpu_matches_cpu --test-threads=1
TILES=17,28,35,41,42,43
MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=$TILES timeout 90 $BB/minisgl-attention "prefill" --bench --warm-up-time 0.1 --measurement-time 0.25 > $W/bench.log 2>&1
echo "bench rc=$? tiles $TILES ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/bench.log >> $S
PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
ncu_prefill 41 "32/8 b=1 L=4096"
echo "end at $(( $(date +%s) - START )) s" >> $S
