#!/usr/bin/env bash
# Runs ON a GPU machine, after scripts/stage-vllm-fa.py has staged the build: sweeps one of vLLM's
# FlashAttention builds (vllm_fa2 or vllm_fa3) over this GPU's whole case space, resumably, and copies the
# records to $OUT.
#
# usage: bash scripts/vllm-fa-sweep.sh vllm_fa2|vllm_fa3 SECONDS [more `attnmatrix probe` options]
#   SECONDS       the sweep stops (SIGKILL, records already written are kept) after this long; the same
#                 command later resumes where it stopped, skipping recorded cases
#   env VLLM_FA_SITE  where the build was unpacked (default /root/vllm-fa; put on PYTHONPATH here)
#       RESULTS       result file (default /root/attnmatrix/<arch>-<backend>.jsonl), copied to $OUT at the end
#       WORKERS       worker processes (default 8); TIMEOUT seconds per case (default 120, FA2 300)
#
# The build must import before anything is probed, and the vLLM release it came from is printed: a build
# that does not import is a message here, never a sweep of `unavailable` records.
#
# vLLM 0.26.0's _vllm_fa2_C carries sm_80 machine code and compute_80 PTX only (scripts/fatbin-archs.py):
# on sm_90 and later the driver compiles each FA2 kernel from PTX on its first use. The driver's compute
# cache is raised to its 4 GiB maximum so that the workers share those compiles instead of evicting each
# other's (the default is 256 MiB), and FA2 cases get a longer timeout.
set -uo pipefail
usage="usage: vllm-fa-sweep.sh vllm_fa2|vllm_fa3 SECONDS [probe options]"
backend=${1:?$usage}
limit=${2:?$usage}
shift 2
case $backend in vllm_fa2|vllm_fa3) ;; *) echo "vllm-fa-sweep: $backend is not vllm_fa2 or vllm_fa3" >&2; exit 2;; esac
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
site=${VLLM_FA_SITE:-/root/vllm-fa}
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export CUDA_CACHE_MAXSIZE=${CUDA_CACHE_MAXSIZE:-4294967296}
ext="_vllm_${backend#vllm_}_C"
timeout_s=${TIMEOUT:-$([[ $backend == vllm_fa2 ]] && echo 300 || echo 120)}
python3 -c "
import importlib.metadata as md
import torch
import vllm.vllm_flash_attn.$ext as ext
print('$backend: vLLM', md.version('vllm'), '|', ext.__file__, '| torch', torch.__version__, '| CUDA', torch.version.cuda)
" || { echo "vllm-fa-sweep: $ext does not import from $site; stage it first (scripts/stage-vllm-fa.py)" >&2; exit 1; }
if ! python3 -c 'import attnmatrix.cli' 2> /dev/null; then
  python3 -m pip install -q --no-deps --no-build-isolation -e . || { echo "vllm-fa-sweep: cannot install attnmatrix" >&2; exit 1; }
fi
arch=$(python3 -c 'import torch; m, n = torch.cuda.get_device_capability(); print(f"sm_{m}{n}")')
mkdir -p /root/attnmatrix
res=${RESULTS:-/root/attnmatrix/$arch-$backend.jsonl}
out=${OUT:-attnmatrix-results}
mkdir -p "$out"
start=$(date +%s)
timeout --signal=KILL "$limit" attnmatrix probe --backends "$backend" --workers "${WORKERS:-8}" \
  --timeout "$timeout_s" -o "$res" --json "$@" > "$res.summary.json" 2> "$res.stderr"
rc=$?
echo "$backend: probe exit $rc after $(( $(date +%s) - start )) s; $(wc -l < "$res") records in $res"
cat "$res.summary.json" 2> /dev/null
tail -n 5 "$res.stderr"
cp "$res" "$res.summary.json" "$out/" 2> /dev/null
python3 - "$res" <<'PY'
import collections
import json
import sys

counts, versions = collections.Counter(), collections.Counter()
for line in open(sys.argv[1], encoding="utf-8"):
    try:
        d = json.loads(line)
    except ValueError:
        continue
    counts[(d["case"]["op"], d["outcome"])] += 1
    versions[d.get("provenance", {}).get("kernel_version")] += 1
print("outcomes:", " ".join(f"{op}:{o}={n}" for (op, o), n in sorted(counts.items())))
print("kernel versions:", dict(versions))
PY
exit 0
