#!/bin/bash
# Twentieth session, call 1: the TMA prefill tiles (27..31: 22..26 with whole K/V
# tiles copied by TMA through tensor maps of the caches) beside tile 17 (the
# default), 24 (the cp.async twin of FA3's schedule, its C7518 serialisation gone)
# and torch SDPA in the same run; their correctness against the CPU (slots past
# every key poisoned with NaN); an ncu of the best; then, on an H200, the headline
# figures of issues 12, 13 and 15.
BUDGET=${BUDGET:-560}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
A="--bench --warm-up-time 0.1 --measurement-time 0.3"
# 1. speed at issue 12's three shapes (bf16, head dim 128, page 16); SDPA after
MINISGL_BENCH_PREFILL_TILES=17,24,27,28,29,30,31 timeout 200 $BB/minisgl-attention "prefill-new" $A > $W/bench.log 2>&1
echo "bench rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/bench.log >> $S
PYTHONUNBUFFERED=1 timeout 60 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
# 2. correctness: long sequences (bf16 and f16), then the tile sweep for two TMA tiles
t 100 wg_long env MINISGL_TEST_PREFILL_TILES=17,24,27,28,29,30,31 $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_long --test-threads=1
t 60 matches env $T/kernel-runtime-gpu_prefill prefill_attention_gpu_matches_cpu --test-threads=1
t 150 wg_tiles env MINISGL_TEST_PREFILL_TILES=29,30 $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_tiles --test-threads=1
# 3. on an H200 the headline figures (the eighteenth session's script), else an ncu of tile 29 and 17
if grep -q H200 $S; then
  for i in 1 2; do step_with "r$i" qwen3_0_6b_graph_step_time_gpu; done
  step_with "r1" llama3_8b_graph_step_time_ctx128_gpu
  step_with "r1" qwen3_30b_a3b_graph_step_time_gpu
  [ $(left) -gt 50 ] && { timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/mbench.log 2>&1
    echo "mbench rc=$? $(grep -E 'output throughput|^time' $W/mbench.log | tr '\n' ' ')" >> $S; }
else
  SEC="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis"
  for tile in 29 17; do
    [ $(left) -lt 40 ] && break
    MINISGL_BENCH_PREFILL_TILES=$tile timeout $(( $(left) - 8 )) ncu --clock-control none $SEC --kernel-name regex:prefill_attention --launch-skip 3 --launch-count 1 \
      $BB/minisgl-attention "prefill-new tile=$tile 32/8 b=1 L=4096" --bench --warm-up-time 0.05 --measurement-time 0.05 > $W/ncu-$tile.log 2>&1
    echo "ncu tile $tile rc=$?" >> $S
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|L1/TEX Hit|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Stall" $W/ncu-$tile.log | head -20 >> $S
  done
fi
echo "end at $(( $(date +%s) - START )) s" >> $S
