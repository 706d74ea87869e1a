#!/usr/bin/env bash
# Runs ON a GPU machine (after FA4 etc. are installed, see ../shared/device/README.md): a sweep of the
# given CUDA backends, resumable, its results copied to $OUT at the end.
#
# usage: bash scripts/h200-sweep.sh BACKENDS SECONDS [more `attnmatrix probe` options...]
#   env RESULTS  name of the result file (default <arch>-sweep): /root/attnmatrix/$RESULTS.jsonl
#       WORKERS  worker processes in all (default 6 per GPU); GPUS: indices to use (default all)
#       TIMEOUT  seconds per case (default 300: first calls JIT-compile)
#
# The results live in /root/attnmatrix/ while the machine stays warm, so a later call (or several
# sweeps at once, e.g. one per library) resumes or shares them; on a fresh machine, put the last
# results at .resume/$RESULTS.jsonl (carried) to resume from them. Sweeps that run at the same time
# take turns on each GPU for timed loops (the runner's per-GPU lock file), never for validation.
set -uo pipefail
backends=${1:?usage: h200-sweep.sh BACKENDS SECONDS [probe options]}
limit=${2:?usage: h200-sweep.sh BACKENDS SECONDS [probe options]}
shift 2
out=${OUT:-attnmatrix-results}
mkdir -p "$out" /root/attnmatrix
if ! python3 -c 'import attnmatrix.cli' 2> /dev/null; then
  python3 -m pip install -q --no-deps --no-build-isolation -e . > /root/attnmatrix/install.log 2>&1 \
    || { cat /root/attnmatrix/install.log; exit 1; }
fi
[[ -f "$out/nvidia-smi.csv" ]] || nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm \
  --format=csv > "$out/nvidia-smi.csv" 2>&1
arch=$(python3 -c 'import torch; m,n=torch.cuda.get_device_capability(); print(f"sm_{m}{n}")')
name=${RESULTS:-$arch-sweep}
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
gpus=${GPUS:-$(seq -s, 0 $((ngpu - 1)))}
nsel=$(awk -F, '{print NF}' <<< "$gpus")
res=/root/attnmatrix/$name.jsonl
log=/root/attnmatrix/$name.log
[[ ! -f $res && -f .resume/$name.jsonl ]] && cp ".resume/$name.jsonl" "$res"
start=$(date +%s)
echo "== $(date -u +%FT%TZ) $backends on GPUs $gpus, limit $limit s, args: $*" >> "$log"
timeout --signal=KILL "$limit" attnmatrix probe --backends "$backends" --gpus "$gpus" \
  --workers "${WORKERS:-$((6 * nsel))}" --timeout "${TIMEOUT:-300}" -o "$res" --json "$@" \
  > "/root/attnmatrix/$name.summary.json" 2>> "$log"
rc=$?
echo "$name: probe exit $rc after $(( $(date +%s) - start )) s on GPUs $gpus; $(wc -l < "$res") records"
cat "/root/attnmatrix/$name.summary.json" 2> /dev/null
cat "/root/attnmatrix/$name.summary.json" >> "$log" 2> /dev/null
cp "$res" "$log" "$out/" 2> /dev/null
python3 - "$res" <<'PY'
import json, sys, collections
c = collections.Counter()
for line in open(sys.argv[1]):
    try:
        d = json.loads(line)
    except ValueError:
        continue
    c[(d["case"]["backend"], d["outcome"])] += 1
print(" ".join(f"{b}:{o}={n}" for (b, o), n in sorted(c.items())))
PY
exit 0
