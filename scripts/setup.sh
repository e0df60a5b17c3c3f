# shellcheck shell=bash
# The setup steps, as functions, for the scripts that need some of them
# (sourcing this file installs nothing):
#   _minisgl_cuda     the CUDA 13.0 compiler and NVRTC from PyPI into .cuda/
#                     (no driver, no GPU needed); an nvcc already on the
#                     machine (CUDA_HOME, or /usr/local/cuda) is used as is
#   _minisgl_libclang libclang for bindgen (the codegen freshness test), on
#                     Debian/Ubuntu through apt-get
#   _minisgl_pydeps   the Python packages of the client tests into .pydeps/
#   _minisgl_paths    CUDA_HOME's bin and lib on PATH and LD_LIBRARY_PATH
#   _minisgl_has_gpu  whether this machine has an NVIDIA driver loaded
# scripts/env.sh runs them all (the test command); scripts/serve.sh only what
# serving needs, and on a machine without a GPU none of them.

MINISGL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export MINISGL_ROOT

_minisgl_log() { printf 'minisgl setup: %s\n' "$*" >&2; }

_minisgl_cuda() {
  if [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then return; fi
  if [ -x /usr/local/cuda/bin/nvcc ] && [ -z "${MINISGL_PYPI_CUDA:-}" ]; then
    export CUDA_HOME=/usr/local/cuda
    return
  fi
  local dir="$MINISGL_ROOT/.cuda"
  local home="$dir/nvidia/cu13"
  if [ ! -x "$home/bin/nvcc" ] || [ ! -e "$home/lib/libnvrtc.so.13" ]; then
    _minisgl_log "installing the CUDA 13.0 compiler and NVRTC from PyPI into $dir"
    python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --target "$dir" \
      "cuda-toolkit[nvcc,nvvm,crt,cudart,cccl,nvrtc]==13.0.2"
  fi
  # nvcc from the wheels expects lib64 and unversioned library names.
  ln -sfn lib "$home/lib64"
  ln -sf libcudart.so.13 "$home/lib/libcudart.so"
  ln -sf libnvrtc.so.13 "$home/lib/libnvrtc.so"
  export CUDA_HOME="$home"
}

_minisgl_libclang() {
  if ldconfig -p 2>/dev/null | grep -qE 'libclang(-[0-9.]+)?\.so'; then return; fi
  if command -v apt-get >/dev/null 2>&1; then
    _minisgl_log "installing libclang (bindgen) with apt-get"
    local sudo=""
    if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq >/dev/null
    $sudo apt-get install -y -qq libclang1-14 libclang-common-14-dev >/dev/null
  else
    _minisgl_log "libclang not found and apt-get unavailable: install libclang (bindgen needs it)"
  fi
}

_minisgl_pydeps() {
  local dir="$MINISGL_ROOT/.pydeps"
  local stamp="$dir/.minisgl-pydeps-3"
  if [ ! -e "$stamp" ]; then
    _minisgl_log "installing the Python test clients into $dir"
    python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --target "$dir" \
      "openai==2.8.1" "gguf==0.19.0" "numpy<3" "jsonschema==4.23.0"
    touch "$stamp"
  fi
  export PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}"
}

_minisgl_paths() {
  if [ -n "${CUDA_HOME:-}" ]; then
    export PATH="$CUDA_HOME/bin:$PATH"
    export LD_LIBRARY_PATH="$CUDA_HOME/lib:$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  if [ -z "${LIBCLANG_PATH:-}" ] && [ -d /usr/lib/llvm-14/lib ]; then export LIBCLANG_PATH=/usr/lib/llvm-14/lib; fi
}

# A loaded NVIDIA kernel driver is what `--device auto` needs to find a GPU;
# without one, kernels and the CUDA compiler would be built for nothing.
# MINISGL_NO_GPU=1 says "no GPU" on a machine that has one.
_minisgl_has_gpu() {
  if [ -n "${MINISGL_NO_GPU:-}" ]; then return 1; fi
  [ -e /proc/driver/nvidia/version ] || [ -e /dev/nvidiactl ]
}
