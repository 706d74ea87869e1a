# Source this before probing FlashInfer (backends flashinfer, trtllm_*) on a GPU machine:
#
#   . scripts/flashinfer-env.sh [--offline]
#
# FlashInfer compiles each kernel variant the first time it is called, with the machine's nvcc, and
# caches it under ~/.cache/flashinfer (keep that folder between runs, e.g. as a CI cache, and nothing is
# compiled twice). This sets what that compile needs and cannot always find alone:
# - CUDA_HOME: a toolkit with bin/nvcc and include/cuda.h (FlashInfer otherwise guesses from `which nvcc`);
# - FLASHINFER_CUDA_ARCH_LIST: this GPU's arch only (e.g. 9.0a), not every arch FlashInfer knows;
# - curand_kernel.h, which CUTLASS's headers include, from the pip package nvidia-curand where the
#   toolkit lacks it (FLASHINFER_EXTRA_CUDAFLAGS);
# - a libcuda.so to link XQA's -lcuda against, from the driver's libcuda.so.1 where the toolkit has no
#   stub (FLASHINFER_EXTRA_LDFLAGS);
# - ninja on PATH, from the pip package ninja where there is no system one.
# --offline also sets FLASHINFER_NO_DOWNLOAD=1: the trtllm-gen kernels (trtllm_ragged, trtllm_context,
# and trtllm_decode on Blackwell) are cubins FlashInfer downloads on first use; without network it would
# retry for minutes per case, and with this set those backends say at once that they are unavailable.
_fi_py=${PYTHON:-python3}
_fi_cuda=${CUDA_HOME:-}
if [[ -z $_fi_cuda ]]; then
  _fi_nvcc=$(command -v nvcc || true)
  for _fi_c in /usr/local/cuda ${_fi_nvcc:+"$(dirname "$(dirname "$(readlink -f "$_fi_nvcc")")")"}; do
    if [[ -x $_fi_c/bin/nvcc && -f $_fi_c/include/cuda.h ]]; then _fi_cuda=$_fi_c; break; fi
  done
fi
if [[ -z $_fi_cuda ]]; then
  echo "flashinfer-env: no CUDA toolkit with bin/nvcc and include/cuda.h found: set CUDA_HOME" >&2
else
  export CUDA_HOME=$_fi_cuda
  export FLASHINFER_CUDA_ARCH_LIST
  FLASHINFER_CUDA_ARCH_LIST=$("$_fi_py" -c 'import torch; m, n = torch.cuda.get_device_capability()
print(f"{m}.{n}a" if m >= 9 else f"{m}.{n}")')
  if [[ ! -f $_fi_cuda/include/curand_kernel.h ]]; then
    _fi_inc=$("$_fi_py" -c 'import glob, os, sys
hits = [h for p in sys.path for h in glob.glob(os.path.join(p, "nvidia", "*", "include", "curand_kernel.h"))]
print(os.path.dirname(hits[0]) if hits else "")')
    if [[ -n $_fi_inc ]]; then export FLASHINFER_EXTRA_CUDAFLAGS="-isystem $_fi_inc"
    else echo "flashinfer-env: no curand_kernel.h: FlashInfer's prefill modules will not compile" >&2; fi
  fi
  if [[ ! -e $_fi_cuda/lib64/stubs/libcuda.so ]] && ! ldconfig -p | grep -q 'libcuda\.so '; then
    _fi_real=$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')
    if [[ -n $_fi_real ]]; then
      mkdir -p "$HOME/.cache/attnmatrix/lib" && ln -sf "$_fi_real" "$HOME/.cache/attnmatrix/lib/libcuda.so"
      export FLASHINFER_EXTRA_LDFLAGS="-L$HOME/.cache/attnmatrix/lib"
    else echo "flashinfer-env: no libcuda.so to link against: FlashInfer's XQA modules will not link" >&2; fi
  fi
  if ! command -v ninja > /dev/null; then
    _fi_ninja=$("$_fi_py" -c 'import ninja, os; print(ninja.BIN_DIR)' 2> /dev/null || true)
    if [[ -n $_fi_ninja ]]; then export PATH=$_fi_ninja:$PATH
    else echo "flashinfer-env: no ninja: FlashInfer cannot compile" >&2; fi
  fi
  [[ ${1:-} == --offline ]] && export FLASHINFER_NO_DOWNLOAD=1
  echo "flashinfer-env: CUDA_HOME=$CUDA_HOME FLASHINFER_CUDA_ARCH_LIST=$FLASHINFER_CUDA_ARCH_LIST" \
    "${FLASHINFER_EXTRA_CUDAFLAGS:+FLASHINFER_EXTRA_CUDAFLAGS='$FLASHINFER_EXTRA_CUDAFLAGS' }${FLASHINFER_EXTRA_LDFLAGS:+FLASHINFER_EXTRA_LDFLAGS=$FLASHINFER_EXTRA_LDFLAGS }${FLASHINFER_NO_DOWNLOAD:+FLASHINFER_NO_DOWNLOAD=1}"
fi
unset _fi_py _fi_cuda _fi_nvcc _fi_c _fi_inc _fi_real _fi_ninja
