#!/bin/bash
# Thirteenth session, call 3 (the session's final kernels = the twelfth session's): torch's
# twins of this session's attention figures (scripts/gpu/torch_baselines.py), the GPU test
# binaries that ran out of their slots last session (gpu_ops, gpu_fused, side by side with
# more test threads) and engine-gpu_tp, then the Llama-3-8B ctx-128 graphed step three
# times over (how much the step figures move between runs).
BUDGET=${BUDGET:-580}
source .gpu/lib.sh
timeout 150 python3 scripts/gpu/torch_baselines.py > $W/torch.log 2>&1; echo "torch rc=$?" >> $S; grep SUMMARY $W/torch.log >> $S
echo "torch done at $(( $(date +%s) - START )) s" >> $S
( t 320 ops $T/kernel-runtime-gpu_ops --test-threads=4 ) &
( t 240 fused $T/kernel-runtime-gpu_fused --test-threads=2; t 70 tp $T/engine-gpu_tp --test-threads=1 ) &
wait
echo "tests done at $(( $(date +%s) - START )) s" >> $S
for i in 1 2 3; do step_with "round $i" llama3_8b_graph_step_time_ctx128_gpu; done
echo "end at $(( $(date +%s) - START )) s" >> $S
