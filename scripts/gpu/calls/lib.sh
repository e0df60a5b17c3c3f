# shellcheck shell=bash
# Sourced by the session call scripts (scripts/gpu/calls/*.sh, copied into .gpu/
# and run from the repository root on the GPU machine): unpacks the bundle, sets
# the environment the tests and benches need, and defines
#   left         seconds left of ${BUDGET:-540}
#   t TO NAME .. a test binary under a timeout; its result line goes to the summary
#   step NAME T  one engine-gpu_graphs test's SUMMARY lines into the summary
#   step_with LABEL T [VAR=value ..]  its `SUMMARY graph-step` lines only, labelled,
#                with those variables set (A/B rounds)
#   bench TO NAME BIN [ARGS..]  a criterion bench under a timeout (short warm-up and
#                measurement); its SUMMARY lines into the summary
#   ncu_prefill TILE CASE  ncu of one launch of prefill tile TILE in the attention
#                bench's case CASE ("32/8 b=1 L=4096"): report, details and
#                per-instruction SASS under $W, key lines in the summary
#   ncu_decode NAME [VAR=value ..]  ncu of two decode attention launches of the
#                Qwen3-0.6B graphed step test, with those variables set: the report,
#                its details and per-instruction SASS under $W, key lines in the summary
#                (sections: $NCU_SECTIONS)
#   timeline TEST LAYER  the kernel timeline of one engine-gpu_graphs step test
#                (CUPTI: .gpu/libkernel_timeline.so beside libcupti.so.13, carried
#                xz-compressed; scripts/gpu/build_timeline.sh), tabulated for each
#                graph replayed 50 times or more, with timeline_table.py's layer
#                table (--layer LAYER: K,FIRST or auto,FIRST)
#   fin          (trapped on exit) the summary and a tarball of the logs under $OUT
# Variables: BIN (binaries), T (tests), BB (benches), W (work dir), S (summary).
START=$(date +%s); left() { echo $(( ${BUDGET:-540} - ($(date +%s) - START) )); }
rm -rf /tmp/minisgl-bundle && mkdir -p /tmp/minisgl-bundle && tar xJf .gpu/bin.tar.xz -C /tmp/minisgl-bundle
ROOT=$(pwd); BIN=/tmp/minisgl-bundle/bin; T=$BIN/tests; BB=$BIN/benches
export MINISGL_KERNELS=$ROOT/.gpu/kernels MINISGL_CACHE_DIR=/tmp/minisgl-cache MINISGL_GPU_TESTS=1 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH=/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64:/usr/local/nvidia/lib64
B=$(cat .gpu/built_at); [ -e "$B" ] || { mkdir -p "$(dirname "$B")"; ln -s "$ROOT" "$B"; }
# engine-gpu_tp runs the `minisgl` binary from its build path (CARGO_BIN_EXE_minisgl).
mkdir -p "$ROOT/target/release"; ln -sf "$BIN/minisgl" "$ROOT/target/release/minisgl"
W=/tmp/w; rm -rf $W; mkdir -p $W; S=$OUT/summary.txt; : > $S
fin() { cat $W/t-*.sum >> $S 2>/dev/null; cp $S $W/; tar czf $OUT/logs.tgz -C /tmp w; }
trap fin EXIT
t() { local to=$1 name=$2; shift 2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 10 ] && { echo "$name skipped" > $W/t-$name.sum; return; }
  timeout $to "$@" > $W/$name.log 2>&1; echo "$name rc=$? $(grep -E '^test result' $W/$name.log | tail -1) ($(( $(date +%s) - START )) s)" > $W/t-$name.sum; grep -E 'panicked|FAILED|failed:|error' $W/$name.log | head -12 >> $W/t-$name.sum; }
step() { local name=$1; shift; [ $(left) -lt 40 ] && { echo "$name skipped" >> $S; return; }; timeout 90 $T/engine-gpu_graphs $1 --test-threads=1 --nocapture 2>&1 | grep SUMMARY | sed "s/^/$name /" >> $S; }
step_with() { local label=$1 test=$2; shift 2; [ $(left) -lt 45 ] && { echo "$label $test skipped" >> $S; return; }
  env "$@" timeout 90 $T/engine-gpu_graphs $test --test-threads=1 --nocapture 2>&1 | grep 'SUMMARY graph-step' | sed "s/^/$label /" >> $S; }
mkdir -p /tmp/q06; cp tests/configs/qwen3-0.6b/config.json /tmp/q06/; cp tests/fixtures/qwen3-tiny/tokenizer* /tmp/q06/
NCU_SECTIONS=${NCU_SECTIONS:-"--section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis --section SourceCounters --section InstructionStats"}
ncu_decode() { local name=$1; shift; [ $(left) -lt 60 ] && { echo "ncu $name skipped" >> $S; return; }
  # shellcheck disable=SC2086 # the sections are separate arguments
  env "$@" timeout 55 ncu --clock-control none $NCU_SECTIONS --kernel-name regex:decode_attention_kernel \
    --launch-skip 300 --launch-count 2 -o $W/$name $T/engine-gpu_graphs qwen3_0_6b_graph_step_time_gpu --test-threads=1 > $W/ncu-$name.log 2>&1
  echo "ncu $name rc=$?" >> $S
  ncu -i $W/$name.ncu-rep --print-details all > $W/$name-details.txt 2>&1
  ncu -i $W/$name.ncu-rep --page source --csv --print-source sass > $W/$name-sass.csv 2>&1
  grep -E "Duration|Registers Per|Grid Size|Block Size|Achieved Occupancy|Warp Cycles Per Issued" $W/$name-details.txt | head -14 >> $S
}
bench() { local to=$1 name=$2; shift 2; [ $(left) -lt $to ] && to=$(left); [ $to -lt 15 ] && { echo "$name skipped" >> $S; return; }
  timeout $to "$@" --bench --warm-up-time 0.1 --measurement-time 0.2 > $W/$name.log 2>&1; echo "$name rc=$? ($(( $(date +%s) - START )) s)" >> $S; grep -E '^SUMMARY' $W/$name.log >> $S; }
ncu_prefill() { local tile=$1 case=$2; [ $(left) -lt 45 ] && { echo "ncu tile $tile skipped" >> $S; return; }
  # The filter names one case, so --launch-skip lands on this tile's launches.
  MINISGL_BENCH_ATTENTION_FILTER="prefill-new tile=$tile $case" MINISGL_BENCH_PREFILL_TILES=$tile timeout $(( $(left) - 10 )) \
    ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
    --section SourceCounters --section LaunchStats --import-source no --kernel-name regex:prefill_attention --launch-skip 3 \
    --launch-count 1 -o $W/ncu-$tile $BB/minisgl-attention "prefill" --bench --warm-up-time 0.05 --measurement-time 0.05 > $W/ncu-$tile.log 2>&1
  echo "ncu tile $tile rc=$?" >> $S
  ncu -i $W/ncu-$tile.ncu-rep --print-details all > $W/ncu-$tile-details.txt 2>&1
  ncu -i $W/ncu-$tile.ncu-rep --page source --csv --print-source sass > $W/ncu-$tile-sass.csv 2>&1
  grep -E "Grid Size|Duration|Compute \(SM\) Throughput|L2 Cache Throughput|Warp Cycles Per Issued|No Eligible" $W/ncu-$tile-details.txt | head -8 >> $S
}
timeline() { local test=$1 layer=$2; [ $(left) -lt 70 ] && { echo "timeline $test skipped" >> $S; return; }
  [ -e .gpu/libcupti.so.13.xz ] && [ ! -e .gpu/libcupti.so.13 ] && xz -dk .gpu/libcupti.so.13.xz
  CUDA_INJECTION64_PATH=$ROOT/.gpu/libkernel_timeline.so MINISGL_TIMELINE=$W/tl-$test.csv \
    timeout 70 $T/engine-gpu_graphs $test --test-threads=1 --nocapture > $W/tl-$test.log 2>&1
  echo "timeline $test rc=$?" >> $S; grep 'SUMMARY graph-step' $W/tl-$test.log >> $S
  for g in $(python3 scripts/gpu/timeline_table.py $W/tl-$test.csv | awk '/graphs: graph/ && $8 >= 50 {sub(":","",$5); print $5}'); do
    python3 scripts/gpu/timeline_table.py $W/tl-$test.csv --graph $g --layer $layer --label "$test" 2>&1 | grep -E "graph $g:|layer|by name" | head -30 >> $S
  done
  gzip -f $W/tl-$test.csv
}
