#!/bin/bash
# Builds scripts/gpu/prefill_probe.cu once per prefill tile variant into .gpu/probe/
# (run after `cargo xtask gpu-bundle`, which empties .gpu/): a development tool, see
# the file's header. Arguments: NAME:TILE[:EXTRA_NVCC_FLAGS] ..., e.g.
#   scripts/gpu/build_prefill_probe.sh base:28 base:17 tree:28:-DMSGL_EXPERIMENT=1
# Binaries are named prefill_probe_NAME_TTILE; run them on the GPU machine.
# PREFILL_SRC=path builds them from another copy of prefill_attention.cu.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/env.sh >/dev/null
mkdir -p .gpu/probe
inc=$(mktemp -d)
echo '#define MSGL_FOR_EACH_INSTANCE(X)' > "$inc/msgl_instances.inc"
for spec in "$@"; do
  IFS=: read -r name tile extra <<< "$spec"
  out=.gpu/probe/prefill_probe_${name}_T${tile}
  # shellcheck disable=SC2086
  "$CUDA_HOME/bin/nvcc" -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I csrc/include -I "$inc" \
    -DMSGL_JIT_INSTANCE -DMSGL_DTYPE=2 -DMSGL_HEAD_DIM=128 -DMSGL_TILE="$tile" -DMSGL_PROBE_NAME="\"$name\"" \
    ${PREFILL_SRC:+-DMSGL_PROBE_KERNEL="\"$(realpath "$PREFILL_SRC")\""} $extra scripts/gpu/prefill_probe.cu csrc/kernels/abi.cu -o "$out"
  echo "built $out"
done
rm -rf "$inc"
