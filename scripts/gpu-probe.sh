#!/usr/bin/env bash
# Probe this machine's GPUs into one result file, resumably, and check the file.
#
# usage: bash scripts/gpu-probe.sh [--check] [--out DIR] [--max-seconds N] [--] [attnmatrix probe options...]
#
#   --check          only report: the GPUs, torch and CUDA, and each CUDA backend's library (installed
#                    version, or why it does not import); probes nothing
#   --out DIR        where the result file goes (default: attnmatrix-results)
#   --max-seconds N  stop the sweep cleanly after N seconds (e.g. a CI job's time limit); run the same
#                    command again later to go on where it stopped: recorded cases are skipped
#   anything else    passed to `attnmatrix probe` as is (--backends, --head-dims, --dtypes, --workers, ...)
#
# The result file is DIR/<arch>-<gpu>-<date>.jsonl (e.g. attnmatrix-results/sm_90-h200-20261130.jsonl),
# with the sweep's summary beside it (<same name>.summary.json). Run from the repository root, on the
# GPU machine, in the Python environment that has torch and the kernel libraries. site/gpu-probing.md is
# the whole recipe (install, probe, collect, merge), including machines without network.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=attnmatrix-results
max_seconds=
check_only=
probe_args=()
while (($#)); do
  case "$1" in
    --check) check_only=1 ;;
    --out) out=${2:?--out needs a directory}; shift ;;
    --max-seconds) max_seconds=${2:?--max-seconds needs a number}; shift ;;
    --) shift; probe_args+=("$@"); break ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) probe_args+=("$1") ;;
  esac
  shift
done
py=${PYTHON:-python3}

if ! "$py" -c 'import attnmatrix.cli' 2> /dev/null; then
  echo "attnmatrix is not installed in $("$py" -c 'import sys; print(sys.prefix)'): installing this checkout (no dependencies)"
  "$py" -m pip install -q --no-deps --no-build-isolation -e . || {
    echo "error: could not install attnmatrix; run: $py -m pip install -e ." >&2; exit 2; }
fi

# What this machine is, and which CUDA backends can run here (importing a library can take seconds).
report=$("$py" - <<'PY'
import importlib.metadata as md
import json
import re
import sys

import torch

if not torch.cuda.is_available():
    print(f"error: torch {torch.__version__} sees no CUDA GPU (a CPU build of torch, or no driver)", file=sys.stderr)
    sys.exit(2)
from attnmatrix.kernels.base import known_backends, load_backend

major, minor = torch.cuda.get_device_capability()
gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
print(f"{len(gpus)} GPU(s): {', '.join(sorted(set(gpus)))}; sm_{major}{minor}; torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}", file=sys.stderr)
for name in known_backends():
    backend = load_backend(name)
    if backend.device != "cuda":
        continue
    why = backend.availability()
    try:
        version = md.version(backend.library)
    except md.PackageNotFoundError:
        version = "not installed"
    print(f"  {name:16} {backend.library} {version}: " + ("ok" if why is None else why), file=sys.stderr)
gpu = re.sub(r"[^a-z0-9]+", "-", gpus[0].lower().replace("nvidia", "")).strip("-") if gpus else "gpu"
print(json.dumps({"arch": f"sm_{major}{minor}", "gpu": gpu}))
PY
) || exit $?
[[ -n $check_only ]] && exit 0

arch=$("$py" -c 'import json, sys; print(json.loads(sys.argv[1])["arch"])' "$report")
gpu=$("$py" -c 'import json, sys; print(json.loads(sys.argv[1])["gpu"])' "$report")
mkdir -p "$out"
name=$out/$arch-$gpu-$(date -u +%Y%m%d)
# resume the newest earlier file of this arch and GPU rather than starting a new one each day
last=$(ls -t "$out/$arch-$gpu"-*.jsonl 2> /dev/null | head -1)
[[ -n $last ]] && name=${last%.jsonl}
echo "results: $name.jsonl"

limit=()
[[ -n $max_seconds ]] && limit=(timeout --signal=INT --kill-after=60 "$max_seconds")
${limit[@]+"${limit[@]}"} attnmatrix probe -o "$name.jsonl" --json ${probe_args[@]+"${probe_args[@]}"} > "$name.summary.json"
rc=$?
cat "$name.summary.json"
case $rc in
  0) ;;
  124|130) echo "stopped at the time limit: run the same command again to go on" ;;
  *) echo "attnmatrix probe exited with $rc" >&2 ;;
esac
[[ -s $name.jsonl ]] || exit "$rc"
attnmatrix validate --no-embedded "$name.jsonl" || exit 1
echo
echo "next, on the machine with the repository (site/gpu-probing.md, 'Merge'):"
echo "  attnmatrix merge $name.jsonl -o matrix/data/results/$("$py" scripts/evidence_name.py "$name.jsonl")"
echo "  attnmatrix validate && attnmatrix generate && attnmatrix check"
exit "$rc"
