#!/bin/bash
# Builds scripts/gpu/kernel_timeline.c into .gpu/libkernel_timeline.so beside CUPTI's
# libcupti.so.13 (run after `cargo xtask gpu-bundle`, which empties .gpu/). CUPTI's
# headers and library come from the nvidia-cuda-cupti wheel of the pinned CUDA 13.0
# toolkit, installed once under .cupti/ (a development tool: nothing of it ships).
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/env.sh >/dev/null
if [ ! -e .cupti/nvidia/cu13/lib/libcupti.so.13 ]; then
  python3 -m pip install --quiet --no-deps --target .cupti "nvidia-cuda-cupti==13.0.85"
fi
C=.cupti/nvidia/cu13
mkdir -p .gpu
gcc -O2 -Wall -Wextra -shared -fPIC -I"$C/include" -I"$CUDA_HOME/include" scripts/gpu/kernel_timeline.c \
  -o .gpu/libkernel_timeline.so -L"$C/lib" -l:libcupti.so.13 -Wl,-rpath,'$ORIGIN'
cp "$C/lib/libcupti.so.13" .gpu/
echo "built .gpu/libkernel_timeline.so (with libcupti.so.13 beside it)"
