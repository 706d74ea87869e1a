#!/usr/bin/env bash
# Runs ON an sm_90 GPU machine (H200), one phase per call (each well under 10 minutes): re-probes the
# committed passes whose validation could not discriminate a feature, re-times a sample of the matrix
# with GPU time and host time apart, and checks the product's timer against triton's. Everything it
# writes goes to $OUT; commit what comes back (results into matrix/data/results/, the timing check's
# output into benchmarks/results/).
#
#   phase  needs                                   writes under $OUT
#   sdpa   nothing beyond the image (torch+triton)  timing_check-sdpa.jsonl, blind-sm_90.jsonl,
#                                                   reprobe-sdpa.jsonl, retime-sdpa.jsonl
#   fa4    FA4 installed (../shared/device: stage.sh, timing_check-fa4.jsonl, blind-sm_90.jsonl,
#          then install.sh; /tmp/gpu-env.sh sourced)  reprobe-fa4.jsonl, retime-fa4.jsonl
#   fa2    .gpu/fa2 carried (the built FA2 parts)     timing_check-fa2.jsonl, blind-sm_90.jsonl,
#                                                   reprobe-fa2.jsonl, retime-fa2.jsonl
#   fi     FlashInfer installed (site/gpu-probing.md: scripts/offline-install.sh, then
#          `. scripts/flashinfer-env.sh --offline`), if it can be: its blind passes
#
# env LIMIT: seconds the re-probe and re-time steps may start cases for (default 90 each; each step is
# killed 60 s after that, its records safe on disk: a later call resumes). SAMPLE: cases of the timing
# check per backend and dtype (default 6). The steps together stay under 9 minutes.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
phase=${1:?usage: evidence-h200.sh sdpa|fa4|fa2|fi}
mkdir -p "${OUT:=/root/attnmatrix/out}"
python3 -c 'import attnmatrix.cli' 2> /dev/null \
  || python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/attnmatrix-install.log 2>&1 \
  || export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}
limit=${LIMIT:-90}

case $phase in
  sdpa) backends=sdpa_cudnn,sdpa_flash,sdpa_efficient,sdpa_math; timed=sdpa_cudnn,sdpa_flash,sdpa_efficient ;;
  fa4) backends=fa4; timed=fa4,sdpa_cudnn ;;
  fa2)
    if [[ ! -d /tmp/fa2site ]]; then
      cat .gpu/fa2/fa2site.tar.gz.part-* | tar -xzf - -C /tmp || { echo "carry .gpu/fa2 (the built FA2)"; exit 1; }
    fi
    export PYTHONPATH=/tmp/fa2site${PYTHONPATH:+:$PYTHONPATH}  # FA2's regular flash_attn: never beside FA4
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
# The committed list (benchmarks/results/blind-passes-sm_90.jsonl, written by the same command) is used
# as it is; without it the list is computed here, on the GPU.
blind=benchmarks/results/blind-passes-sm_90.jsonl
if [[ ! -s $blind ]]; then
  blind=$OUT/blind-sm_90.jsonl
  [[ -s $blind ]] || timeout 120 python3 scripts/reprobe.py blind --device cuda -o "$blind" 2> "$OUT/blind-sm_90.log"
  tail -c 600 "$OUT/blind-sm_90.log"
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
