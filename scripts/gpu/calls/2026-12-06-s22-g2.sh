#!/bin/bash
# Twenty-second session, call 2 (bundle of the anchored overlap, on 4a2239a's producer:
# the next item's Q loaded under the current one, snaking walk): the overlapped tiles
# (28, 29, 35) now run their softmax under P V (a shared-memory store keeps ptxas's
# wait_group 0 after the exponentials). Correctness first (the persistent walks for
# 4a2239a's producer, the long and sweep tests for the overlapped tiles), then the
# prefill bench beside torch SDPA, racecheck of the anchor, an ncu of tile 28.
BUDGET=${BUDGET:-560}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
A="--bench --warm-up-time 0.1 --measurement-time 0.3"
G=$T/kernel-runtime-gpu_prefill
t 120 walks $G prefill_attention_gpu_persistent_walks --test-threads=1 --nocapture
t 100 wg_long env MINISGL_TEST_PREFILL_TILES=27,28,29,35 $G prefill_attention_gpu_wgmma_long --test-threads=1
t 100 wg_tiles env MINISGL_TEST_PREFILL_TILES=28,29,33,35 $G prefill_attention_gpu_wgmma_tiles --test-threads=1
t 40 matches $G prefill_attention_gpu_matches_cpu --test-threads=1
TILES=17,27,28,29,34,35
MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=$TILES timeout $(( $(left) > 160 ? 150 : $(left) - 10 )) $BB/minisgl-attention "prefill" $A > $W/bench.log 2>&1
echo "bench rc=$? tiles $TILES ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/bench.log >> $S
PYTHONUNBUFFERED=1 timeout 60 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
[ $(left) -gt 80 ] && { env MINISGL_TEST_PREFILL_TILES=28 timeout 70 compute-sanitizer --tool racecheck $G prefill_attention_gpu_wgmma_tiles --test-threads=1 > $W/racecheck.log 2>&1
  echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|hazard' $W/racecheck.log | tail -2 | tr '\n' ' ')" >> $S; }
SEC="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section SourceCounters --section LaunchStats"
tile=28
[ $(left) -gt 45 ] && { MINISGL_BENCH_ATTENTION_FILTER="prefill-new tile=$tile 32/8 b=1 L=4096" MINISGL_BENCH_PREFILL_TILES=$tile timeout $(( $(left) - 12 )) \
    ncu --clock-control none $SEC --import-source no --kernel-name regex:prefill_attention --launch-skip 3 --launch-count 1 -o $W/ncu-$tile \
    $BB/minisgl-attention "prefill" --bench --warm-up-time 0.05 --measurement-time 0.05 > $W/ncu-$tile.log 2>&1
  echo "ncu tile $tile rc=$?" >> $S
  ncu -i $W/ncu-$tile.ncu-rep --print-details all > $W/ncu-$tile-details.txt 2>&1
  ncu -i $W/ncu-$tile.ncu-rep --page source --csv --print-source sass > $W/ncu-$tile-sass.csv 2>&1
  grep -E "Grid Size|Duration|Compute \(SM\) Throughput|L2 Cache Throughput|Warp Cycles Per Issued|No Eligible" $W/ncu-$tile-details.txt | head -8 >> $S; }
echo "end at $(( $(date +%s) - START )) s" >> $S
