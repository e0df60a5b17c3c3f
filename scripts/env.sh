# shellcheck shell=bash
# Sourced by the other scripts: installs (once) and puts on the paths what the
# build and the tests need. Everything goes inside the checkout:
#   .cuda/    the CUDA 13.0 compiler and NVRTC from PyPI (no driver, no GPU needed)
#   .pydeps/  Python packages of the client tests (openai, gguf, numpy)
# and, on Debian/Ubuntu, libclang for bindgen (the codegen freshness test).
# An nvcc already on the machine (CUDA_HOME, or /usr/local/cuda) is used as is.

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
  local stamp="$dir/.minisgl-pydeps-2"
  if [ ! -e "$stamp" ]; then
    _minisgl_log "installing the Python test clients into $dir"
    python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --target "$dir" \
      "openai==2.8.1" "gguf==0.19.0" "numpy<3"
    touch "$stamp"
  fi
  export PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}"
}

_minisgl_cuda
_minisgl_libclang
_minisgl_pydeps
export PATH="$CUDA_HOME/bin:$PATH"
export LD_LIBRARY_PATH="$CUDA_HOME/lib:$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -z "${LIBCLANG_PATH:-}" ] && [ -d /usr/lib/llvm-14/lib ]; then export LIBCLANG_PATH=/usr/lib/llvm-14/lib; fi
