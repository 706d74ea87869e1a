#!/usr/bin/env bash
# Bring vLLM's FA4 copy (vllm/vllm_flash_attn/cute, pure Python) out of the vLLM wheel, and an
# environment with the CuTe DSL version vLLM pins, for the `vllm_fa4` backend (kernels/vllm_fa4.py).
#
#   scripts/fetch-vllm-fa4.sh [VLLM_VERSION] [DEST] [VENV]
#
# VLLM_VERSION defaults to 0.33.0; DEST (the extracted copy) to $ATTNMATRIX_VLLM_FA4_DIR or
# ~/.cache/attnmatrix/vllm-fa4; VENV (a venv over this one's site-packages with vLLM's pins of
# nvidia-cutlass-dsl[cu13] and apache-tvm-ffi) to ~/.cache/attnmatrix/venv-vllm-fa4. Nothing from the
# wheel is installed or run: only cute/*.py and METADATA are extracted. Then, for example:
#
#   VENV/bin/attnmatrix xcompile --backends vllm_fa4 --arch sm_100a --arch sm_103a --arch sm_110a \
#       -o matrix/data/results/xcompile-vllm_fa4-0.33.0.jsonl
set -euo pipefail
version="${1:-0.33.0}"
dest="${2:-${ATTNMATRIX_VLLM_FA4_DIR:-$HOME/.cache/attnmatrix/vllm-fa4}}"
venv="${3:-$HOME/.cache/attnmatrix/venv-vllm-fa4}"
here="$(cd "$(dirname "$0")/.." && pwd)"
dl="$(mktemp -d)"
trap 'rm -rf "$dl"' EXIT
python -m pip download -q --no-deps "vllm==$version" --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 -d "$dl"
wheel="$(ls "$dl"/vllm-"$version"-*.whl)"
pins="$(python -c "from attnmatrix.kernels.vllm_fa4 import extract_wheel; import json, sys; \
print(json.dumps(extract_wheel(sys.argv[1], sys.argv[2])))" "$wheel" "$dest")"
echo "extracted vLLM $version's FA4 copy into $dest: $pins"
cutlass="$(python -c "import json,sys; print(json.loads(sys.argv[1]).get('cutlass_dsl', ''))" "$pins")"
tvm="$(python -c "import json,sys; print(json.loads(sys.argv[1]).get('tvm_ffi', ''))" "$pins")"
if [ -n "$cutlass" ]; then
  python -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install -q "nvidia-cutlass-dsl[cu13]==$cutlass" ${tvm:+"apache-tvm-ffi==$tvm"}
  "$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$here"
  echo "environment with nvidia-cutlass-dsl $cutlass${tvm:+, apache-tvm-ffi $tvm}: $venv"
fi
