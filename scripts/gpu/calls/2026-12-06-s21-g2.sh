#!/bin/bash
# Twenty-first session, call 2: the persistent prefill tiles after call 1's ncu
# (consumers waited on the next item's Q: the producer now loads item n + 1's Q
# once item n's first two K/V tiles are issued; the blocks walk the items in
# snaking rows, so their sums of keys stay even) and the restructured producer of
# every warp-specialised tile (27, the long-prompt default, included). Correctness
# first, the bench (prefill cases only: MINISGL_BENCH_ATTENTION_FILTER) beside
# torch SDPA, the tile sweep, racecheck/synccheck of a persistent walk, an ncu.
# Not run in the twenty-first session (no device time left): main holds the kernel
# call 1 ran (commit c2e2712 took 4a2239a's producer back out); `git revert c2e2712`,
# rebuild the bundle, then run this.
BUDGET=${BUDGET:-560}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
A="--bench --warm-up-time 0.1 --measurement-time 0.3"
G=$T/kernel-runtime-gpu_prefill
t 120 walks $G prefill_attention_gpu_persistent_walks --test-threads=1 --nocapture
t 100 wg_long env MINISGL_TEST_PREFILL_TILES=27,28,34,35,36,37,38 $G prefill_attention_gpu_wgmma_long --test-threads=1
t 40 matches $G prefill_attention_gpu_matches_cpu --test-threads=1
# On an H200 (the targets' card) the headline figures next (the twentieth session's
# H200 script): Qwen3-0.6B bs=1 (two rounds), Llama-3-8B ctx 128, the 30B, the bench.
if grep -q H200 $S; then
  for i in 1 2; do step_with "r$i" qwen3_0_6b_graph_step_time_gpu; done
  step_with "r1" llama3_8b_graph_step_time_ctx128_gpu
  step_with "r1" qwen3_30b_a3b_graph_step_time_gpu
  timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/mbench.log 2>&1
  echo "mbench rc=$? $(grep -E 'output throughput|^time' $W/mbench.log | tr '\n' ' ')" >> $S
fi
TILES=17,27,28,34,35,36
grep -q "walks rc=0" $W/t-walks.sum || TILES=17,27,28
MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=$TILES timeout $(( $(left) > 160 ? 150 : $(left) - 10 )) $BB/minisgl-attention "prefill" $A > $W/bench.log 2>&1
echo "bench rc=$? tiles $TILES ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/bench.log >> $S
PYTHONUNBUFFERED=1 timeout 60 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
t 100 wg_tiles env MINISGL_TEST_PREFILL_TILES=27,34,35 $G prefill_attention_gpu_wgmma_tiles --test-threads=1
for tool in racecheck synccheck; do
  [ $(left) -gt 80 ] && { env MINISGL_TEST_PREFILL_TILES=34 timeout 70 compute-sanitizer --tool $tool $G prefill_attention_gpu_persistent_walks --test-threads=1 > $W/$tool.log 2>&1
    echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|hazard' $W/$tool.log | tail -2 | tr '\n' ' ')" >> $S; }
done
tile=35; grep -q "walks rc=0" $W/t-walks.sum || tile=27
SEC="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section SourceCounters --section LaunchStats"
[ $(left) -gt 45 ] && { MINISGL_BENCH_ATTENTION_FILTER="prefill-new tile=$tile 32/8 b=1 L=4096" MINISGL_BENCH_PREFILL_TILES=$tile timeout $(( $(left) - 12 )) \
    ncu --clock-control none $SEC --import-source no --kernel-name regex:prefill_attention --launch-skip 3 --launch-count 1 -o $W/ncu-$tile \
    $BB/minisgl-attention "prefill" --bench --warm-up-time 0.05 --measurement-time 0.05 > $W/ncu-$tile.log 2>&1
  echo "ncu tile $tile rc=$?" >> $S
  ncu -i $W/ncu-$tile.ncu-rep --print-details all > $W/ncu-$tile-details.txt 2>&1
  ncu -i $W/ncu-$tile.ncu-rep --page source --csv --print-source sass > $W/ncu-$tile-sass.csv 2>&1
  grep -E "Grid Size|Duration|Compute \(SM\) Throughput|L2 Cache Throughput|Warp Cycles Per Issued|No Eligible" $W/ncu-$tile-details.txt | head -8 >> $S; }
echo "end at $(( $(date +%s) - START )) s" >> $S
