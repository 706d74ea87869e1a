#!/usr/bin/env bash
# Runs ON a GPU machine (after FA4 is installed, see ../shared/device/README.md): the standard sweep
# of the given CUDA backends, resumable, its results copied to $OUT at the end.
# usage: bash scripts/h200-sweep.sh [BACKENDS] [SECONDS]
# The results live in /root/attnmatrix/ while the machine stays warm, so a second call resumes; on a
# fresh machine, put the last results at .resume/<arch>-sweep.jsonl (carried) to resume from them.
set -uo pipefail
backends=${1:-fa4,fa3,sdpa_flash,sdpa_efficient,sdpa_cudnn,sdpa_math}
limit=${2:-540}
out=${OUT:-attnmatrix-results}
mkdir -p "$out" /root/attnmatrix
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$out/nvidia-smi.csv" 2>&1
arch=$(python3 -c 'import torch; m,n=torch.cuda.get_device_capability(); print(f"sm_{m}{n}")')
res=/root/attnmatrix/$arch-sweep.jsonl
[[ ! -f $res && -f .resume/$arch-sweep.jsonl ]] && cp ".resume/$arch-sweep.jsonl" "$res"
trap 'cp "$res" "$out/" 2>/dev/null' EXIT
start=$(date +%s)
# Several workers share the GPU: FA4's JIT compiles run in parallel, timed loops take turns.
timeout --signal=KILL "$limit" attnmatrix probe --backends "$backends" --workers "${WORKERS:-10}" \
  --timed-dtypes bfloat16 --timeout 300 -o "$res" --json > "$out/summary.json" 2> "$out/sweep.log"
rc=$?
echo "probe exit $rc after $(( $(date +%s) - start )) s; $(wc -l < "$res") records in $res"
tail -c 2500 "$out/sweep.log"
cat "$out/summary.json" 2>/dev/null
python3 - "$res" <<'PY'
import json, sys, collections
c = collections.Counter()
for line in open(sys.argv[1]):
    try:
        d = json.loads(line)
    except ValueError:
        continue
    c[(d["case"]["backend"], d["outcome"])] += 1
for k, v in sorted(c.items()):
    print(*k, v)
PY
exit 0
