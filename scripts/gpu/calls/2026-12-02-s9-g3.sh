#!/bin/bash
# Ninth session, call 3: benches/gemm.rs timed from CUDA-graph replays (the eager
# back-to-back timing was host-bound at the small shapes), M = 1, 4, 16, 64, beside
# torch.matmul eager and from a graph (scripts/gpu/torch_gemm_baselines.py), one run.
START=$(date +%s); left() { echo $(( ${BUDGET:-540} - ($(date +%s) - START) )); }
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests; BB=$BIN/benches
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
fin() { cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w; }
trap fin EXIT
MINISGL_GEMM_BENCH_MS=1,4,16,64 timeout $(( $(left) - 150 )) $BB/minisgl-gemm --bench --warm-up-time 0.1 --measurement-time 0.3 > $W/gemm.log 2>&1; echo "gemm rc=$? at $(( $(date +%s) - START )) s" >> $S
grep SUMMARY $W/gemm.log > $W/gemm.sum
timeout $(( $(left) - 5 )) python3 scripts/gpu/torch_gemm_baselines.py > $W/torch.log 2>&1; echo "torch rc=$? at $(( $(date +%s) - START )) s" >> $S
grep "SUMMARY torch gemm" $W/torch.log >> $S
# The compact table: per shape and m, the best of each kernel kind.
python3 - $W/gemm.sum >> $S <<'PY'
import re, sys, collections
best = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    m = re.match(r"SUMMARY gemm (\S+) (\S+) m=(\d+) (.+?): median ([\d.]+) us, ([\d.]+) TB/s", line)
    if not m: continue
    model, proj, rows, variant, us, tbs = m.groups()
    kind = variant.split()[0].split("-")[0].rstrip("0123456789")
    key = (model, proj, int(rows))
    if kind not in best[key] or float(us) < best[key][kind][0]:
        best[key][kind] = (float(us), float(tbs), variant)
for key in sorted(best):
    cells = "  ".join(f"{k}={v[0]:.2f}us/{v[1]:.2f}({v[2]})" for k, v in sorted(best[key].items()))
    print("BEST", *key, cells)
PY
echo "end at $(( $(date +%s) - START )) s" >> $S
