#!/bin/bash
# Thirteenth session, call 2 (commit of the half-tile ring's revert): the machine's
# anchors (clocks, a torch copy and GEMM), the cold attention bench with the whole-tile
# pipeline (the batch-64 short-context cases at 2 and 3 stages), the graphed step
# figures and `minisgl bench` with cuBLASLt's measured choice over the heuristic's
# first 8 (default) and first 32 algorithms (MINISGL_GEMM_TUNE_CANDIDATES).
# (MINISGL_GEMM_TUNE_CANDIDATES existed only in the bundle of this call, commit 4505bc4: reverted after it.)
BUDGET=${BUDGET:-560}
source .gpu/lib.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active --format=csv >> $S 2>&1
python3 - >> $S 2>&1 <<'PY'
import torch
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
w = torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda"); a = torch.randn(64, 4096, dtype=torch.bfloat16, device="cuda")
ws = [torch.randn(4096, 4096, dtype=torch.bfloat16, device="cuda") for _ in range(16)]
def t(f, n=50):
    for _ in range(5): f()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True); r = []
    for _ in range(n):
        s.record(); f(); e.record(); torch.cuda.synchronize(); r.append(s.elapsed_time(e) * 1e3)
    r.sort(); return r[len(r) // 2]
c = t(lambda: y.copy_(x), 20)
print(f"ANCHOR torch copy 2 GiB: {c:.1f} us, {2 * (2 << 30) / c / 1e6:.3f} TB/s")
i = [0]
def mm():
    i[0] = (i[0] + 1) % 16; torch.matmul(a, ws[i[0]].t())
g = t(mm, 200)
print(f"ANCHOR torch matmul m=64 4096x4096 bf16 (16 weights rotated): {g:.2f} us, {4096 * 4096 * 2 / g / 1e6:.3f} TB/s")
PY
( export MINISGL_BENCH_ATTENTION=cold; timeout 130 $BB/minisgl-attention --bench > $W/bench-attention.log 2>&1; echo "attention rc=$?" >> $S; grep SUMMARY $W/bench-attention.log | sed 's/ (.*bytes per launch)//' >> $S )
echo "attention done at $(( $(date +%s) - START )) s" >> $S
for c in 8 32; do
  export MINISGL_GEMM_TUNE_CANDIDATES=$c
  for x in qwen3_0_6b_graph_step_time_gpu llama3_8b_graph_step_time_ctx128_gpu; do
    timeout 100 $T/engine-gpu_graphs $x --test-threads=1 --nocapture > $W/step-$c-$x.log 2>&1
    grep 'SUMMARY graph-step' $W/step-$c-$x.log | sed "s/^/cand=$c /" >> $S
    grep -E 'SUMMARY gemm tune m=(1|64) ' $W/step-$c-$x.log | sed "s/^/cand=$c /" >> $S
  done
  timeout 45 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench-$c.log 2>&1
  echo "bench cand=$c rc=$? $(grep -E 'output throughput|^time' $W/bench-$c.log | tr '\n' ' ') $(grep -o 'captured.*' $W/bench-$c.log)" >> $S
  grep -E '^  (decode|prefill)' $W/bench-$c.log >> $S
done
echo "end at $(( $(date +%s) - START )) s" >> $S
