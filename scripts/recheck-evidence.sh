#!/usr/bin/env bash
# Runs ON a GPU machine, one phase per backend family (each well under 10 minutes): re-probes the
# committed passes whose validation could not discriminate a feature (benchmarks/results/
# blind-passes-<arch>.jsonl, or computed here), re-times a sample of the matrix with GPU time and host
# time apart, and checks the product's timer against triton's. Install the libraries first
# (site/gpu-probing.md). Everything it writes goes to $OUT (default attnmatrix-results/recheck); merge
# the result files into matrix/data/results/ as the recipe's step 4 says.
#
#   phase  needs                                         writes under $OUT
#   sdpa   torch with CUDA (and triton, for the check)   timing_check-sdpa.{txt,jsonl}, reprobe-sdpa.jsonl,
#                                                        retime-sdpa.jsonl
#   fa4    flash-attn-4                                  the same, -fa4
#   fa2    flash-attn 2 in its own folder, named by      the same, -fa2
#          FA2_SITE (scripts/isolate-fa2.py makes it)
#   fi     flashinfer-python (. scripts/flashinfer-env.sh)  the same, -fi
#
# env LIMIT: seconds the re-probe and re-time steps may start cases for (default 90 each; each step is
# killed 60 s after that, its records safe on disk: running the phase again resumes). SAMPLE: cases of
# the timing check per backend and dtype (default 6).
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
phase=${1:?usage: recheck-evidence.sh sdpa|fa4|fa2|fi}
mkdir -p "${OUT:=attnmatrix-results/recheck}"
python3 -c 'import attnmatrix.cli' 2> /dev/null \
  || python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/attnmatrix-install.log 2>&1 \
  || export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}
limit=${LIMIT:-90}

case $phase in
  sdpa) backends=sdpa_cudnn,sdpa_flash,sdpa_efficient,sdpa_math; timed=sdpa_cudnn,sdpa_flash,sdpa_efficient ;;
  fa4) backends=fa4; timed=fa4,sdpa_cudnn ;;
  fa2)
    [[ -n ${FA2_SITE:-} ]] && export PYTHONPATH=$FA2_SITE${PYTHONPATH:+:$PYTHONPATH}  # never beside FA4
    backends=fa2; timed=fa2 ;;
  fi) backends=flashinfer,trtllm_decode,trtllm_ragged,trtllm_context; timed=flashinfer,trtllm_decode ;;
  *) echo "unknown phase $phase"; exit 2 ;;
esac

start=$(date +%s)
step() { echo "== $(( $(date +%s) - start )) s: $*"; }
step "timing check ($timed)"
timeout 150 python3 benchmarks/timing_check.py --backends "$timed" --sample "${SAMPLE:-6}" \
  --out "$OUT/timing_check-$phase.jsonl" > "$OUT/timing_check-$phase.txt" 2>&1
echo "timing check exit $?"; tail -22 "$OUT/timing_check-$phase.txt"
step "blind passes (version-1 validation problems that could not discriminate a feature)"
# The committed list (benchmarks/results/blind-passes-<arch>.jsonl, written by the same command) is used
# as it is; without it the list is computed here, on the GPU.
arch=$(python3 -c 'import torch; m, n = torch.cuda.get_device_capability(); print(f"sm_{m}{n}")') || exit 2
blind=benchmarks/results/blind-passes-$arch.jsonl
if [[ ! -s $blind ]]; then
  blind=$OUT/blind-$arch.jsonl
  [[ -s $blind ]] || timeout 120 python3 scripts/reprobe.py blind --arch "$arch" --device cuda -o "$blind" \
    2> "$OUT/blind-$arch.log"
  tail -c 600 "$OUT/blind-$arch.log"
fi
step "re-probe the blind passes of $backends"
timeout -s KILL $((limit + 60)) python3 scripts/reprobe.py run --cases "$blind" \
  --backends "$backends" --limit-s "$limit" --slice 16 -o "$OUT/reprobe-$phase.jsonl" --run-id "reprobe-$phase" \
  2> "$OUT/reprobe-$phase.log"
step "re-time a sample of $backends"
timeout -s KILL $((limit + 60)) python3 scripts/reprobe.py retime --backends "$backends" --sample 36 \
  --limit-s "$limit" --slice 16 -o "$OUT/retime-$phase.jsonl" --run-id "retime-$phase" 2> "$OUT/retime-$phase.log"
step "done"
python3 - "$OUT" <<'PY'
import collections, glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*-*.jsonl"))):
    c = collections.Counter()
    for line in open(path):
        d = json.loads(line)
        if "case" in d and "outcome" in d:
            c[(d["case"]["backend"], d["outcome"])] += 1
    if c:
        print(os.path.basename(path), " ".join(f"{b}:{o}={n}" for (b, o), n in sorted(c.items())))
PY
