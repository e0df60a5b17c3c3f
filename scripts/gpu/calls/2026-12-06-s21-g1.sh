#!/bin/bash
# Twenty-first session, call 1: the persistent TMA prefill tiles (34, 35, 36 = 27,
# 28, 30 with one block an SM walking the items and a second Q buffer), and for
# every warp-specialised tile the release barriers counted by warps (8 arrivals a
# phase, not 256), the full barriers' one arrival, no proxy fence before TMA tiles
# and the page numbers read a tile ahead. Correctness first (a hang or a failure
# drops 34..36 from the bench), then the bench beside torch SDPA, then an ncu with
# per-instruction stall samples of the best persistent tile.
BUDGET=${BUDGET:-560}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
A="--bench --warm-up-time 0.1 --measurement-time 0.3"
G=$T/kernel-runtime-gpu_prefill
# 1. correctness: the persistent walks (1 and 3 blocks), the long cases
t 150 walks $G prefill_attention_gpu_persistent_walks --test-threads=1 --nocapture
t 110 wg_long env MINISGL_TEST_PREFILL_TILES=27,28,34,35,36,37,38 $G prefill_attention_gpu_wgmma_long --test-threads=1
TILES=17,27,28,30,34,35,36,37,38
grep -q "walks rc=0" $W/t-walks.sum || TILES=17,27,28,30
# 2. speed at issue 12's shapes (bf16, head dim 128, page 16); SDPA after
MINISGL_BENCH_PREFILL_TILES=$TILES timeout 220 $BB/minisgl-attention "prefill-new" $A > $W/bench.log 2>&1
echo "bench rc=$? tiles $TILES ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/bench.log | grep -v decode >> $S
PYTHONUNBUFFERED=1 timeout 60 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
# 3. the tile sweep (pages 1/16/64, head dims 64/128/256, bf16/f16, GQA 1-8) and the defaults
t 120 wg_tiles env MINISGL_TEST_PREFILL_TILES=34,35,36,37,38 $G prefill_attention_gpu_wgmma_tiles --test-threads=1
t 50 matches $G prefill_attention_gpu_matches_cpu --test-threads=1
# 4. ncu of tile 34 (27 if 34 failed) at 32/8 b=1 L=4096: SASS-level stall samples
tile=34; grep -q "walks rc=0" $W/t-walks.sum || tile=27
SEC="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section SourceCounters --section LaunchStats"
[ $(left) -gt 50 ] && { MINISGL_BENCH_PREFILL_TILES=$tile timeout $(( $(left) - 15 )) ncu --clock-control none $SEC --import-source no \
    --kernel-name regex:prefill_attention --launch-skip 3 --launch-count 1 -o $W/ncu-$tile \
    $BB/minisgl-attention "prefill-new tile=$tile 32/8 b=1 L=4096" --bench --warm-up-time 0.05 --measurement-time 0.05 > $W/ncu-$tile.log 2>&1
  echo "ncu tile $tile rc=$?" >> $S
  ncu -i $W/ncu-$tile.ncu-rep --print-details all > $W/ncu-$tile-details.txt 2>&1
  ncu -i $W/ncu-$tile.ncu-rep --page source --csv --print-source sass > $W/ncu-$tile-sass.csv 2>&1
  grep -E "Grid Size|Duration|Compute \(SM\) Throughput|L2 Cache Throughput|Registers Per|Warp Cycles Per Issued|Issue Slots Busy|No Eligible" $W/ncu-$tile-details.txt | head -12 >> $S; }
echo "end at $(( $(date +%s) - START )) s" >> $S
