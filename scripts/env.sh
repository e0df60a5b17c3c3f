# shellcheck shell=bash
# Sourced by the test command and the GPU scripts: installs (once) and puts on
# the paths everything the build and the tests need, inside the checkout:
#   .cuda/    the CUDA 13.0 compiler and NVRTC from PyPI (no driver, no GPU needed)
#   .pydeps/  Python packages of the client tests (openai, gguf, numpy)
# and, on Debian/Ubuntu, libclang for bindgen (the codegen freshness test).
# The steps are the functions of scripts/setup.sh; scripts/serve.sh runs fewer.

source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
_minisgl_cuda
_minisgl_libclang
_minisgl_pydeps
_minisgl_paths
