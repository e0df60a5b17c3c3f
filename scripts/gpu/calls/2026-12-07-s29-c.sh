#!/bin/bash
# Twenty-ninth session, call C (the call-B bundle): how close the decode kernel runs to
# the H100's HBM limit at the bench's widest step. ncu's speed of light and memory
# sections of one cold graph-timed launch of 16/8 b=256 ctx=U[100,2048] in the
# scheduler's order (longest first), beside torch's read and copy rates of 2 GiB in
# the same call (the anchors).
BUDGET=${BUDGET:-200}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
python3 - >> $S 2>&1 <<'PY'
import torch
x = torch.empty(1 << 30, dtype=torch.bfloat16, device="cuda").normal_()
y = torch.empty_like(x)
def timed(f, n=20):
    for _ in range(3): f()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(n):
        s.record(); f(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / 1e3)
    return sorted(ts)[n // 2]
b = x.numel() * 2
t = timed(lambda: x.sum(dtype=torch.float32))
print(f"anchor torch sum 2 GiB bf16 (read): {t * 1e6:.1f} us, {b / t / 1e12:.3f} TB/s")
t = timed(lambda: y.copy_(x))
print(f"anchor torch copy 2 GiB (read + write): {t * 1e6:.1f} us, {2 * b / t / 1e12:.3f} TB/s")
PY
MINISGL_BENCH_ATTENTION=cold MINISGL_BENCH_ATTENTION_FILTER="b=256 ctx=U[100,2048] longest-first" timeout 120 \
  ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
  --kernel-name regex:decode_attention --launch-skip 5 --launch-count 1 -o $W/ncu-b256 \
  $BB/minisgl-attention --bench --warm-up-time 0.05 --measurement-time 0.05 > $W/ncu-b256.log 2>&1
echo "ncu b256 rc=$?" >> $S
ncu -i $W/ncu-b256.ncu-rep --print-details all > $W/ncu-b256-details.txt 2>&1
grep -E "Duration|DRAM Throughput|Memory Throughput|dram__bytes|Max Bandwidth|L2 Hit|Achieved Occupancy|Registers Per|Grid Size|Waves Per SM" $W/ncu-b256-details.txt | head -20 >> $S
echo "end at $(( $(date +%s) - START )) s" >> $S
