#!/bin/bash
# Thirteenth session, call 4 (prepared, not run: no machine was lent for it): A/B rounds,
# alternating, of settings that need no new code, on the graphed steps whose targets are
# closest (Qwen3-0.6B bs=1 <= 0.8 ms; Llama-3-8B bs=64 <= 5.5 ms, bs=1 <= 4.3 ms):
#  - MINISGL_GEMM_TUNE=0 against the measured choice: whether the tuner's cold, isolated
#    timing ranks m = 1 weight streams as a graph replays them (call 2: Llama-3-8B bs=1
#    4.771 ms with gate_up #2 chosen, 4.615 ms with the heuristic's #0 kept);
#  - MINISGL_DECODE_SPLIT_MERGE=1 against the combine launch at the default 2 stages (the
#    tenth session measured the in-launch merge in steps only at 3 stages).
# Three rounds each; the step tests print the step, the GPU replay and the replay behind
# a backlog.
BUDGET=${BUDGET:-560}
source .gpu/lib.sh
for i in 1 2 3; do
  step_with "r$i tuned" llama3_8b_graph_step_time_ctx128_gpu
  step_with "r$i untuned" llama3_8b_graph_step_time_ctx128_gpu MINISGL_GEMM_TUNE=0
  step_with "r$i combine" qwen3_0_6b_graph_step_time_gpu
  step_with "r$i merge" qwen3_0_6b_graph_step_time_gpu MINISGL_DECODE_SPLIT_MERGE=1
done
echo "end at $(( $(date +%s) - START )) s" >> $S
