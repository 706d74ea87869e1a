#!/usr/bin/env bash
# Run HERE, in the project's root (needs pip and a registry; no GPU). Downloads what FlashInfer needs
# on the GPU machine (Python 3.12, x86-64, torch 2.11 + CUDA 13.0 already there) and packs it into two
# bundles under .gpu/fi/, each well under one call's 64 MiB:
#   .gpu/fi/a  first half of the flashinfer-python wheel, apache-tvm-ffi, torch-c-dlpack-ext  (~53 MiB)
#   .gpu/fi/b  second half of the wheel and its SHA-256                                         (~49 MiB)
# See kernels/FLASHINFER_OFFLINE.md for why exactly these. Then, on the GPU machine, back to back
# (the machine is given back ~30 s after a call ends):
#   call 1: carry [".gpu/fi/a"]  command: bash scripts/install-flashinfer.sh stage
#   call 2: carry [".gpu/fi/b"]  command: bash scripts/install-flashinfer.sh && . /tmp/fi-env.sh && <command>
# Later calls on the same warm machine need only: . /tmp/fi-env.sh && <command>
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qxF '/.gpu/' .gitignore .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude

# Pins: flashinfer-python 0.7.4 is the newest release (pure-Python wheel, JIT; no torch pin). The
# tvm-ffi pins are the ones pack-fa4.sh uses, so both can live in one /tmp/site.
FLASHINFER=flashinfer-python==0.7.4
DEPS=(apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5)

rm -rf .gpu/fi && mkdir -p .gpu/fi/dl .gpu/fi/a .gpu/fi/b
plat=(--only-binary=:all: --python-version 3.12 --implementation cp)
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64; do plat+=(--platform "$p"); done
python3 -m pip download -q --no-deps "${plat[@]}" -d .gpu/fi/dl "$FLASHINFER" "${DEPS[@]}"

wheel=$(ls .gpu/fi/dl/flashinfer_python-*.whl)
name=$(basename "$wheel")
(cd .gpu/fi/dl && sha256sum "$name" > "../b/$name.sha256")
split -n 2 -d "$wheel" ".gpu/fi/dl/$name.part."   # two equal halves: .part.00 and .part.01
mv ".gpu/fi/dl/$name.part.01" .gpu/fi/b/
rm "$wheel"
mv .gpu/fi/dl/* .gpu/fi/a/
rmdir .gpu/fi/dl
ls -l .gpu/fi/a .gpu/fi/b
for d in a b; do
  bytes=$(du -sb ".gpu/fi/$d" | cut -f1)
  echo ".gpu/fi/$d: $((bytes / 1048576)) MiB"
  (( bytes < 60 * 1048576 )) || { echo "bundle $d is over 60 MiB" >&2; exit 1; }
done
