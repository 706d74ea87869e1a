#!/usr/bin/env bash
# Runs ON the lent GPU machine: one device session's probing, phase by phase, one phase per call.
# The machine is given back ~30 s after a call ends, so the calls go back to back; long work runs in
# the background (setsid) and goes on between calls while the machine stays warm. Prepare every call
# before the first one: in session 2 a 2.5-minute pause to fix code between calls lost the machine, with
# the FA2 build, FlashInfer's compiled modules and half of a sweep on it.
#
#   phase      carry                   what it does
#   stage      .gpu/a                  stages FA4's first bundle; starts the FA2 build (~15 min) in the
#                                      background (needs the flash-attn sdist and build-fa2.sh in .gpu/a)
#   fa4        .gpu/b .resume          installs FA4; measures 1 GPU against all GPUs on the same cases;
#                                      starts the main sweep (FA4, FA3, SDPA's four) in the background
#   fi-stage   .gpu/fi/a               stages FlashInfer's first bundle
#   fi         .gpu/fi/b               installs FlashInfer; starts its sweeps (TRT-LLM, FlashInfer) in the
#                                      background
#   fa2        -                       waits for the FA2 build, sweeps FA2, runs `pytest -m gpu`
#   collect    -                       waits up to WAIT s for the background sweeps, copies everything
#
# Every phase ends by copying the result files and logs so far to $OUT and printing progress.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
phase=${1:?usage: h200-session.sh stage|fa4|fi-stage|fi|fa2|collect}
state=/root/attnmatrix
mkdir -p "$state" "${OUT:=$state/out}"
env_files() { for f in /tmp/gpu-env.sh /tmp/fi-env.sh; do [[ -f $f ]] && . "$f"; done; }

background() {  # name command...: runs on after this call returns (until the machine goes back)
  local name=$1; shift
  setsid nohup bash -c "$*" > "$state/$name.bg.log" 2>&1 < /dev/null &
  echo "started $name in the background (pid $!)"
}

progress() {
  python3 - "$state" <<'PY'
import collections, glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.jsonl"))):
    c = collections.Counter()
    for line in open(path):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        c[(d["case"]["backend"], d["outcome"])] += 1
    print(os.path.basename(path), sum(c.values()), " ".join(f"{b}:{o}={n}" for (b, o), n in sorted(c.items())))
PY
  [[ -f /root/fa2.log ]] && tail -n 2 /root/fa2.log
  pgrep -af "attnmatrix probe" | cut -c1-160 || true
}

copy_out() {  # at most 8 files come back: the result files first, then one archive of the logs
  local n=0
  for f in "$state"/*.jsonl; do
    [[ -f $f && $n -lt 6 ]] && cp "$f" "$OUT/" && n=$((n + 1))
  done
  tar -czf "$OUT/logs.tar.gz" -C "$state" --ignore-failed-read $(cd "$state" && ls *.log *.summary.json *.txt 2>/dev/null) \
    /root/fa2.log 2> /dev/null || true
}

case "$phase" in
stage)
  bash .gpu/a/stage.sh
  sdist=$(ls /root/gpu-wheels/flash_attn-*.tar.gz 2> /dev/null | head -1)
  [[ -n "$sdist" ]] || { echo "no flash-attn sdist staged: FA2 will not be built" >&2; exit 0; }
  background fa2-build "MAX_JOBS=${FA2_JOBS:-20} bash /root/gpu-wheels/build-fa2.sh $sdist > /root/fa2.log 2>&1"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  nproc
  ;;
fa4)
  bash .gpu/b/install.sh || exit 1
  env_files
  ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
  if (( ngpu > 1 )); then
    # The same cases on one GPU (a scratch file) and on all of them (kept): the ratio of wall times.
    ratio=(sdpa_efficient 240 --head-dims 64,128,256 --timed-dtypes bfloat16)
    RESULTS=ratio-1gpu GPUS=0 WORKERS=8 bash scripts/h200-sweep.sh "${ratio[@]}"
    WORKERS=$((8 * ngpu)) bash scripts/h200-sweep.sh "${ratio[@]}"
  fi
  background main ". /tmp/gpu-env.sh; WORKERS=$((12 * ngpu)) bash scripts/h200-sweep.sh \
    fa4,fa3,sdpa_cudnn,sdpa_flash,sdpa_efficient,sdpa_math ${MAIN_LIMIT:-1500} --timed-dtypes bfloat16"
  ;;
fi-stage)
  bash scripts/install-flashinfer.sh stage
  ;;
fi)
  bash scripts/install-flashinfer.sh || exit 1
  # The TRT-LLM paths first (trtllm-gen ends `unavailable` at once here; XQA compiles), then FlashInfer's
  # own kernels on MLA prefill dims and head dim 128, then the rest of bf16 as time allows.
  sweep="TIMEOUT=1500 RESULTS=sm_90-flashinfer bash scripts/h200-sweep.sh"
  background fi ". /tmp/fi-env.sh; $sweep trtllm_ragged,trtllm_context 300 --no-timing; \
    WORKERS=16 $sweep flashinfer,trtllm_decode 1500 --dtypes bfloat16 --timed-dtypes bfloat16 \
      --ops decode,mla_prefill --head-dims 128,192x128,256,64; \
    WORKERS=16 $sweep flashinfer 900 --dtypes bfloat16 --timed-dtypes bfloat16 --ops prefill --head-dims 128,64,256; \
    WORKERS=16 $sweep flashinfer,trtllm_decode 900 --dtypes bfloat16 --timed-dtypes bfloat16"
  ;;
fa2)
  for _ in $(seq 1 "${WAIT:-540}"); do grep -q "built for" /root/fa2.log 2> /dev/null && break; \
    grep -q "Error\|error:" /root/fa2.log 2> /dev/null && break; sleep 1; done
  tail -n 3 /root/fa2.log
  env_files
  python3 -c 'import torch, flash_attn; print("flash_attn", flash_attn.__version__)' || exit 0
  background gpu-tests ". /tmp/gpu-env.sh; [[ -f /tmp/fi-env.sh ]] && . /tmp/fi-env.sh; \
    python3 -m pytest -m gpu -v -p no:cacheprovider tests > $state/pytest-gpu.txt 2>&1"
  RESULTS=sm_90-fa2 bash scripts/h200-sweep.sh fa2 "${FA2_LIMIT:-400}"
  ;;
collect)
  for _ in $(seq 1 "${WAIT:-0}"); do pgrep -f "attnmatrix probe" > /dev/null || break; sleep 1; done
  ;;
*) echo "unknown phase $phase" >&2; exit 2 ;;
esac
progress
copy_out
ls -la "$OUT"
