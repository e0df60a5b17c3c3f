#!/bin/bash
# Twenty-fifth session, call G (bundle with the four-warp producer, the register
# search and tile 39 as the long-run default): the prefill tests, the probe of the
# persistent walk (zz_*: zig-zag rounds, the next item prepared early) and the
# 32-candidate search, the attention bench beside torch SDPA; then, on an H200, the
# open H200 figures (2026-12-06-s22-h200.sh) with what is left.
BUDGET=${BUDGET:-540}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
tar xJf .gpu/probe.tar.xz -C .gpu
export MINISGL_TEST_PREFILL_TILES=17,35,39
t 120 matches $T/kernel-runtime-gpu_prefill prefill_attention_gpu_matches_cpu --test-threads=1
t 120 wg_long $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_long --test-threads=1
t 150 wg_tiles $T/kernel-runtime-gpu_prefill prefill_attention_gpu_wgmma_tiles --test-threads=1
MINISGL_TEST_PREFILL_TILES=35 t 90 walks $T/kernel-runtime-gpu_prefill prefill_attention_gpu_persistent_walks --test-threads=1
cat $W/t-*.sum >> $S; rm -f $W/t-*.sum
for b in .gpu/probe/prefill_probe_*; do
  timeout 40 "$b" > $W/$(basename $b).log 2>&1; echo "$(basename $b) rc=$? ($(( $(date +%s) - START )) s)" >> $S
  grep -E "^(SUMMARY|TIMELINE)" $W/$(basename $b).log | grep -v per-tile >> $S
done
timeout 40 .gpu/probe/prefill_probe_zz_T35 32 8 16 512 16 32 8 2 1024 16 32 8 4 2048 16 > $W/zz35-short.log 2>&1
echo "zz35 short rc=$?" >> $S; grep SUMMARY $W/zz35-short.log >> $S
MINISGL_BENCH_ATTENTION_FILTER=prefill MINISGL_BENCH_PREFILL_TILES=17,28,39 bench 80 attn-prefill $BB/minisgl-attention prefill
PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu/torch_baselines.py prefill > $W/torch.log 2>&1
echo "torch rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep SUMMARY $W/torch.log >> $S
echo "prefill part done at $(( $(date +%s) - START )) s" >> $S
if grep -q H200 $S && [ "$(left)" -gt 200 ]; then
  cp $S $OUT/prefill.txt
  BUDGET=$(( $(left) - 5 )) PREFILL_TILES=17,39 bash .gpu/2026-12-06-s22-h200.sh
fi
