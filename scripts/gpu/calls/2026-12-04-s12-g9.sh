#!/bin/bash
# Twelfth session, call 9: the session's final code (cluster merge off by default, the
# combine phase refactored to one merge routine): the GPU suite as far as the time goes,
# the headline step figures (engine-gpu_graphs) and `minisgl bench`.
BUDGET=${BUDGET:-560}
source .gpu/lib.sh
t 150 graphs $T/engine-gpu_graphs --test-threads=1 --nocapture
grep "SUMMARY graph-step" $W/graphs.log >> $S
timeout 40 $BIN/minisgl bench --model /tmp/q06 --load-format dummy --device cuda --vocab-size 151643 > $W/bench.log 2>&1
echo "bench rc=$? $(grep -E 'output throughput|^time' $W/bench.log | tr '\n' ' ')" >> $S
t 80 overlap $T/engine-gpu_overlap --test-threads=1
t 40 fixtures $T/models-gpu_fixtures --test-threads=1
t 170 decode $T/kernel-runtime-gpu_decode --test-threads=1
t 100 fused $T/kernel-runtime-gpu_fused --test-threads=1
for x in ops prefill sampling store_index moe skinny_tiled stream_gemm; do t 90 $x $T/kernel-runtime-gpu_$x --test-threads=1; done
t 60 extras $T/engine-gpu_extras --test-threads=1
t 60 tp $T/engine-gpu_tp --test-threads=1
t 90 dummy $T/models-gpu_dummy --test-threads=1
echo "end at $(( $(date +%s) - START )) s" >> $S
