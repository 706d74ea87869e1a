#!/usr/bin/env bash
# Runs ON the GPU machine, with no network. Installs FlashInfer from the bundles that
# scripts/pack-flashinfer.sh made into /tmp/site and writes /tmp/fi-env.sh (source it in every later
# call). Two calls on one warm machine:
#   call 1: carry [".gpu/fi/a"]  bash scripts/install-flashinfer.sh stage
#   call 2: carry [".gpu/fi/b"]  bash scripts/install-flashinfer.sh && . /tmp/fi-env.sh && <command>
# FlashInfer JIT-compiles each kernel variant on first use (minutes each, see
# kernels/FLASHINFER_OFFLINE.md). To reuse compiled variants in a later session:
#   at the end of a call:  bash scripts/install-flashinfer.sh save-cache $OUT/fi-aot-1.tar.gz
#   keep what comes back; put it in .gpu/fi/b/ before that session's call 2: it is installed as
#   FlashInfer's AOT modules (flashinfer/data/aot/<name>/<name>.so), which load without compiling.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
store=/root/fi-wheels
site=/tmp/site
mkdir -p "$store"

case "${1:-}" in
stage)
  [[ -d "$here/.gpu/fi/a" ]] || { echo "no .gpu/fi/a here: carry it (run scripts/pack-flashinfer.sh first)" >&2; exit 1; }
  cp "$here"/.gpu/fi/a/* "$store/"
  echo "staged $(ls "$store" | wc -l) files in $store; now make call 2 right away"
  exit 0 ;;
save-cache)
  dest=${2:?usage: install-flashinfer.sh save-cache FILE.tar.gz [MODULE_GLOB]}
  pattern=${3:-*}   # e.g. 'xqa_*' or 'batch_*': keeps one file under $OUT's 16 MiB
  list=$(mktemp)
  # JIT builds live in $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<arch>/cached_ops/<name>/<name>.so
  for so in /root/.cache/flashinfer/*/*/cached_ops/$pattern/*.so; do
    [[ -f "$so" && "$(basename "$so" .so)" == "$(basename "$(dirname "$so")")" ]] && echo "$so" >> "$list"
  done
  [[ -s "$list" ]] || { echo "no compiled FlashInfer modules under /root/.cache/flashinfer" >&2; exit 1; }
  tar -caf "$dest" --transform 's#.*/cached_ops/##' -T "$list"   # -a: gzip for .tar.gz, by suffix
  echo "saved $(wc -l < "$list") modules, $(du -h "$dest" | cut -f1), to $dest"
  (( $(stat -c %s "$dest") <= 16 * 1048576 )) || echo "warning: $dest is over 16 MiB: \$OUT will not return it" >&2
  exit 0 ;;
"") ;;
*) echo "usage: install-flashinfer.sh [stage | save-cache FILE.tar.gz [MODULE_GLOB]]" >&2; exit 2 ;;
esac

[[ -d "$here/.gpu/fi/b" ]] && cp "$here"/.gpu/fi/b/* "$store/"
cd "$store"
for sum in flashinfer_python-*.whl.sha256; do
  [[ -e "$sum" ]] || { echo "bundle b is missing: carry .gpu/fi/b" >&2; exit 1; }
  whl=${sum%.sha256}
  if [[ ! -f "$whl" ]]; then
    [[ -f "$whl.part.00" ]] || { echo "bundle a is missing: run call 1 (stage) first, on the same warm machine" >&2; exit 1; }
    cat "$whl.part.00" "$whl.part.01" > "$whl"
    rm "$whl.part.00" "$whl.part.01"
  fi
  sha256sum -c "$sum"
done
# A wheel whose version is already in $site (FA4's install brings the same tvm-ffi) is skipped: pip
# --target --upgrade would delete and rewrite its files under any sweep running from $site (on the H200
# x2 that turned 13 FA4 compiles into "module 'tvm_ffi' has no attribute" errors).
todo=()
for whl in ./*.whl; do
  dist=$(basename "$whl" | cut -d- -f1-2)   # name-version, as in $site/<name>-<version>.dist-info
  if compgen -G "$site/${dist}.dist-info" > /dev/null; then echo "already in $site: $dist"; else todo+=("$whl"); fi
done
(( ${#todo[@]} == 0 )) || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" "${todo[@]}"
for t in fi-aot*.tar*; do   # compiled modules saved by save-cache in an earlier session
  [[ -f "$t" ]] || continue
  mkdir -p "$site/flashinfer/data/aot"
  tar -xf "$t" -C "$site/flashinfer/data/aot"
  echo "installed $(tar -tf "$t" | grep -c '\.so$') prebuilt FlashInfer modules from $t"
done

# What FlashInfer's JIT needs: nvcc and the toolkit headers (CUDA_HOME), ninja on PATH, the target
# arch, curand_kernel.h (CUTLASS's util headers include it) and a libcuda.so to link -lcuda against.
nvcc_bin=$(command -v nvcc || true)
cuda_home=${CUDA_HOME:-}
if [[ -z "$cuda_home" ]]; then
  for c in /usr/local/cuda "$( [[ -n "$nvcc_bin" ]] && dirname "$(dirname "$(readlink -f "$nvcc_bin")")")"; do
    [[ -n "$c" && -x "$c/bin/nvcc" && -f "$c/include/cuda.h" ]] && { cuda_home=$c; break; }
  done
fi
[[ -n "$cuda_home" ]] || { echo "no CUDA toolkit with bin/nvcc and include/cuda.h found; set CUDA_HOME" >&2; exit 1; }
extra_cuda=""
if [[ ! -f "$cuda_home/include/curand_kernel.h" ]]; then
  inc=$(python3 -c 'import glob, os, sys
hits = [h for p in sys.path for h in glob.glob(os.path.join(p, "nvidia", "*", "include", "curand_kernel.h"))]
print(os.path.dirname(hits[0]) if hits else "")')
  if [[ -n "$inc" ]]; then extra_cuda="-isystem $inc"
  else echo "warning: no curand_kernel.h: FlashInfer's prefill JIT (CUTLASS) will not compile" >&2; fi
fi
extra_ld=""
if [[ ! -e "$cuda_home/lib64/stubs/libcuda.so" ]] && ! ldconfig -p | grep -q 'libcuda\.so '; then
  real=$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')
  if [[ -n "$real" ]]; then mkdir -p /tmp/fi-lib && ln -sf "$real" /tmp/fi-lib/libcuda.so && extra_ld="-L/tmp/fi-lib"
  else echo "warning: no libcuda.so to link against: FlashInfer's XQA JIT (-lcuda) will not link" >&2; fi
fi
ninja_dir=""
command -v ninja > /dev/null || ninja_dir=$(python3 -c 'import ninja, os; print(ninja.BIN_DIR)')
arch=$(python3 -c 'import torch; m, n = torch.cuda.get_device_capability(); print(f"{m}.{n}a" if m >= 9 else f"{m}.{n}")')
paths=$site
[[ -d /tmp/sc ]] && paths=/tmp/sc:$site   # FA4's install.sh was run too: keep its sitecustomize
cat > /tmp/fi-env.sh <<EOF
export PYTHONPATH=$paths\${PYTHONPATH:+:\$PYTHONPATH} PYTHONUNBUFFERED=1
export CUDA_HOME=$cuda_home FLASHINFER_CUDA_ARCH_LIST=$arch FLASHINFER_NO_DOWNLOAD=1
export FLASHINFER_WORKSPACE_BASE=/root
${extra_cuda:+export FLASHINFER_EXTRA_CUDAFLAGS=\"$extra_cuda\"}
${extra_ld:+export FLASHINFER_EXTRA_LDFLAGS=$extra_ld}
${ninja_dir:+export PATH=$ninja_dir:\$PATH}
EOF
. /tmp/fi-env.sh
cat /tmp/fi-env.sh
python3 - <<'PY'
import importlib.metadata as m, time
import torch
t = time.time()
import flashinfer  # noqa: F401
print(f"flashinfer {m.version('flashinfer-python')} imported in {time.time() - t:.1f} s; torch {torch.__version__}; "
      f"{torch.cuda.get_device_name()} sm_{''.join(map(str, torch.cuda.get_device_capability()))}")
PY
