#!/usr/bin/env bash
# Download the kernel libraries attnmatrix probes, for a GPU machine that has no network: run this on a
# machine that reaches PyPI, carry DIR over, and install there with scripts/offline-install.sh.
#
# usage: bash scripts/wheelhouse.sh DIR [--python 3.12] [--bundle-mib N] GROUP...
#
#   GROUP        fa4          FlashAttention 4 and its CuTe DSL compiler (flash-attn-4, nvidia-cutlass-dsl
#                             for CUDA 13, quack-kernels, apache-tvm-ffi, torch-c-dlpack-ext)
#                flashinfer   FlashInfer (flashinfer-python; its kernels compile on first use with the
#                             machine's nvcc) and the same apache-tvm-ffi / torch-c-dlpack-ext as fa4
#                fa2          the flash-attn source distribution, to build on the GPU machine
#                tool         attnmatrix's own dependencies except torch (click, jinja2, tabulate, ...)
#   --python     the GPU machine's Python version (default: this one's); wheels are for Linux x86-64
#   --bundle-mib split the download into DIR/bundle-1, bundle-2, ... of at most N MiB each (a file larger
#                than that is cut into parts), for a transfer that limits its size; offline-install.sh
#                joins the parts and checks every file against DIR's SHA256SUMS
#
# The versions are the ones the committed evidence was recorded with (matrix/data/results/); torch is
# never downloaded: the GPU machine's own CUDA build of torch is the one to probe.
set -euo pipefail
dir=${1:?usage: wheelhouse.sh DIR [--python X.Y] [--bundle-mib N] GROUP...}
shift
pyver=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
bundle_mib=
groups=()
while (($#)); do
  case "$1" in
    --python) pyver=${2:?}; shift ;;
    --bundle-mib) bundle_mib=${2:?}; shift ;;
    fa4|flashinfer|fa2|tool) groups+=("$1") ;;
    *) echo "unknown group or option: $1 (groups: fa4 flashinfer fa2 tool)" >&2; exit 2 ;;
  esac
  shift
done
((${#groups[@]})) || { echo "name at least one group: fa4 flashinfer fa2 tool" >&2; exit 2; }
[[ -e $dir ]] && { echo "$dir exists: give a new folder (nothing is overwritten)" >&2; exit 2; }

TVM=(apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5)
declare -A PINS=(
  [fa4]="flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
         nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5 ${TVM[*]}"
  [flashinfer]="flashinfer-python==0.7.4 ${TVM[*]}"
  [tool]="click jinja2 markupsafe packaging tabulate"
)
platform=(--only-binary=:all: --python-version "$pyver" --implementation cp)
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64; do platform+=(--platform "$p"); done

tmp=$(mktemp -d "${dir%/}.partial.XXXX")
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
for g in "${groups[@]}"; do
  if [[ $g == fa2 ]]; then   # a source distribution: built on the GPU machine against its torch and CUDA
    FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE python3 -m pip download -q --no-deps --no-build-isolation \
      --no-binary=:all: -d "$tmp" 'flash-attn==2.8.3.post2'
  else
    # shellcheck disable=SC2086 # the pins are words
    python3 -m pip download -q --no-deps "${platform[@]}" -d "$tmp" ${PINS[$g]}
  fi
done
(cd "$tmp" && sha256sum -- * > SHA256SUMS)

if [[ -n $bundle_mib ]]; then
  python3 - "$tmp" "$bundle_mib" <<'PY'
import os, shutil, sys
src, limit = sys.argv[1], int(sys.argv[2]) * 1048576
pieces = []  # (size, name) of whole files and of the parts of larger ones
for name in sorted(os.listdir(src)):
    if name == "SHA256SUMS":
        continue
    path = os.path.join(src, name)
    size = os.path.getsize(path)
    if size <= limit:
        pieces.append((size, name))
        continue
    with open(path, "rb") as f:
        for i, chunk in enumerate(iter(lambda: f.read(limit), b"")):
            part = f"{name}.part-{i:02d}"
            with open(os.path.join(src, part), "wb") as out:
                out.write(chunk)
            pieces.append((len(chunk), part))
    os.remove(path)
bundles: list[list] = []  # first fit, largest first
for size, name in sorted(pieces, reverse=True):
    for b in bundles:
        if b[0] + size <= limit:
            b[0] += size
            b[1].append(name)
            break
    else:
        bundles.append([size, [name]])
for i, (size, names) in enumerate(bundles, 1):
    d = os.path.join(src, f"bundle-{i}")
    os.makedirs(d)
    for name in names:
        shutil.move(os.path.join(src, name), d)
    shutil.copy(os.path.join(src, "SHA256SUMS"), d)
    print(f"bundle-{i}: {len(names)} files, {size / 1048576:.1f} MiB")
os.remove(os.path.join(src, "SHA256SUMS"))
PY
fi
mv "$tmp" "$dir"
trap - EXIT
echo "wrote $dir for Python $pyver: $(find "$dir" -type f ! -name SHA256SUMS | wc -l) files, $(du -sh "$dir" | cut -f1)"
echo "on the GPU machine: bash scripts/offline-install.sh $dir$([[ -n $bundle_mib ]] && echo '/bundle-*')"
