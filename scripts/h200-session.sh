#!/usr/bin/env bash
# Runs ON the lent GPU machine: one device session's probing, phase by phase, one phase per call.
# The machine is given back ~30 s after a call ends, so the calls go back to back; long work runs in
# the background (setsid) and goes on between calls while the machine stays warm. Prepare every call
# before the first one: in session 2 a 2.5-minute pause to fix code between calls lost the machine, with
# the FA2 build, FlashInfer's compiled modules and half of a sweep on it.
#
#   phase      carry                   what it does
#   stage      .gpu/a                  stages FA4's first bundle; starts the FA2 build (~15 min on 16
#                                      cores) in the background (flash-attn sdist + build-fa2.sh in .gpu/a)
#   fi-stage   .gpu/fi/a               stages FlashInfer's first bundle
#   fi         .gpu/fi/b .resume       installs FlashInfer; starts two sweeps in the background: XQA
#                                      decode (trtllm_decode) and FlashInfer's own kernels (MLA dims first)
#   fa4        .gpu/b (.resume)         installs FA4; starts the main sweep (FA4, FA3, SDPA's four) and the
#                                      FA2 job (waits for the build; FA2's cells with no record, then
#                                      `pytest -m gpu`) in the background
#   ratio      -                       1 GPU against all on PyTorch SDPA's whole bf16 space (1,208 cases),
#                                      timed (needs nothing installed; 142 s and 83 s in session 5)
#   collect    -                       waits up to WAIT s for every background job (SAVE_CACHE=1: saves
#                                      FlashInfer's compiled modules), copies everything
#   fa2-save   -                       after the fa2 job moved FA2 to /tmp/fa2site: packs it into parts under
#                                      16 MiB for $OUT (keep them in .gpu/fa2/ here)
#   fa2-stage  .gpu/fa2                before `stage`, in a later session: restores that FA2 (no build)
#
# Order: the two installs that share /tmp/site (fi, fa4) come before any sweep reads it, the FA2 build
# (the longest job) first of all. Then `collect` calls, back to back, until everything is done.
#
# Session 3 (H200 x2, 1,743 s of device time) found:
# - FA2's build took 1,414 s sharing the cores with FlashInfer's compiles: those now run at nice 19.
#   FA2 is built into the system Python, and there its regular `flash_attn` package hid FA4's
#   `flash_attn.cute` (namespace) in every new process: the FA2 job now moves it to /tmp/fa2site, on
#   the path of FA2's sweep and tests only (scripts/isolate-fa2.py; it worked in session 4).
# - Four concurrent sweeps overloaded the machine (load 87 on 32 cores): timeouts, OOMs and SIGKILLs
#   that say nothing about the kernels (matrix/data/quarantine/README.md). Fewer workers per sweep.
# - `save-cache` archives over 16 MiB do not come back through $OUT.
# Session 4 (H200 x2, 1,636 s of device time) found:
# - The FA2 build took 724 s with 28 jobs beside FlashInfer's compiles at nice 19 (startup ~30 s).
# - Sweeps were CPU-bound on drawing timing inputs, not on the GPU: FA2's timing phases summed to
#   4,165 s with 0.2 s of GPU-lock waits (decode cases 41 s median, 131 s at head dim 256). Timing
#   inputs are now drawn on the GPU; the FA2 1-GPU-vs-2 ratio run was dropped for lack of time.
# - Untimed, FA2's 302 fp16 cases took 24 s on 2 GPUs (745 cases/min).
# - `pkill -f PATTERN` in a `run` command matches that command's own shell: write the pattern so it
#   does not match itself (e.g. "RESULTS=sm_90-flashinfe[r]"), or the call dies with rc -1.
# Session 5 (H200 x2, 1,671 s of device time over three machines: the first for FA2, the ratio and a fresh FA4
# sweep; the second to test fa2-stage and run the GPU tests; the third for FlashInfer) found:
# - FA2 built in 606 s (30 jobs at nice 19, beside the ratio runs and a fresh FA4 sweep); `fa2-save`
#   returned it in 3 parts and `fa2-stage` restored it on a fresh machine, with no build: FA2's tests
#   passed on the restored copy. Later sessions: fa2-stage, then stage (no build).
# - With timing inputs drawn on the GPU, sweeps are GPU-bound (the GPU lock is waited on): SDPA's whole
#   bf16 space took 141.5 s on 1 GPU and 82.8 s on 2 (1.71x); a 156-case subset, 26.7 s against 17.6 s
#   (1.52x: worker start-up weighs more in a short run). FA2's decode cases' timing took 0.3 s (41 s).
# - FlashInfer alone on a machine (no build beside it, not niced) compiles fast: decode modules 12-23 s,
#   prefill modules 101-144 s (368-640 s at nice 19 beside the FA2 build in session 4); sweep_stats.py prints these.
# Every phase ends by copying the result files and logs so far to $OUT and printing progress.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
phase=${1:?usage: h200-session.sh fa2-stage|stage|fi-stage|fi|fa4|ratio|collect|fa2-save}
state=/root/attnmatrix
mkdir -p "$state" "${OUT:=$state/out}"
ensure_project() {  # once, before sweeps start in parallel (two concurrent `pip install -e .` can collide)
  python3 -c 'import attnmatrix.cli' 2> /dev/null \
    || python3 -m pip install -q --no-deps --no-build-isolation -e . > "$state/install.log" 2>&1 || cat "$state/install.log"
}
seed_resume() {  # results carried in .resume/ seed this machine's result files (a later call need not carry them)
  for f in .resume/*.jsonl; do [[ -f $f && ! -f $state/$(basename "$f") ]] && cp "$f" "$state/"; done; true
}
env_files() { for f in /tmp/gpu-env.sh /tmp/fi-env.sh; do [[ -f $f ]] && . "$f"; done; }

background() {  # name command...: runs on after this call returns (until the machine goes back)
  local name=$1; shift
  touch "$state/$name.started"   # `collect` waits for a .done beside every .started
  setsid nohup nice -n "${NICE:-0}" bash -c "( $* ); touch $state/$name.done" > "$state/$name.bg.log" 2>&1 < /dev/null &
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
  # background sweeps copy their files into the $OUT they were started with; only this list comes back
  find "$OUT" -mindepth 1 -delete 2> /dev/null
  for f in "$state"/*.jsonl; do
    [[ -f $f && $n -lt 6 ]] && cp "$f" "$OUT/" && n=$((n + 1))
  done
  for f in "$state"/fi-aot-*.tar.gz; do [[ -f $f && $n -lt 7 ]] && cp "$f" "$OUT/" && n=$((n + 1)); done
  tar -czf "$OUT/logs.tar.gz" -C "$state" --ignore-failed-read $(cd "$state" && ls *.log *.summary.json *.txt 2>/dev/null) \
    /root/fa2.log 2> /dev/null || true
}

case "$phase" in
fa2-save)
  # The built FA2 (/tmp/fa2site, after the fa2 job moved it there), packed in parts under $OUT's 16 MiB per
  # file, so a later session restores it with `fa2-stage` instead of building it again (724 s in session 4).
  # Put what comes back in .gpu/fa2/ (ignored by git; it stays on the developer machine between sessions).
  compgen -G "/tmp/fa2site/flash_attn_2_cuda*.so" > /dev/null || { echo "no FA2 in /tmp/fa2site yet" >&2; exit 1; }
  find "$OUT" -mindepth 1 -delete 2> /dev/null
  tar -czf "$state/fa2site.tar.gz" -C /tmp fa2site
  split -b 15M -d "$state/fa2site.tar.gz" "$OUT/fa2site.tar.gz.part-"
  nparts=$(ls "$OUT"/fa2site.tar.gz.part-* | wc -l)
  echo "$nparts $(sha256sum < "$state/fa2site.tar.gz" | cut -d' ' -f1) $(python3 -c 'import torch; print(torch.__version__)')" \
    > "$OUT/fa2site.manifest"
  (( nparts <= 7 )) || echo "warning: $nparts parts: \$OUT returns at most 8 files a call" >&2
  ls -la "$OUT"; cat "$OUT/fa2site.manifest"
  exit 0
  ;;
fa2-stage)
  # Carry .gpu/fa2 (the parts `fa2-save` returned and the manifest; split over several calls if they and
  # the tree exceed 64 MiB: each call adds what it carries). Once every part is here, FA2 is restored
  # into /tmp/fa2site and `stage` builds nothing.
  mkdir -p /root/fa2parts
  cp .gpu/fa2/* /root/fa2parts/ 2> /dev/null
  [[ -f /root/fa2parts/fa2site.manifest ]] || { echo "no fa2site.manifest carried yet" >&2; exit 0; }
  read -r nparts sum torch_saved < /root/fa2parts/fa2site.manifest
  have=$(ls /root/fa2parts/fa2site.tar.gz.part-* 2> /dev/null | wc -l)
  (( have == nparts )) || { echo "FA2 parts: $have of $nparts here; carry the rest in the next call"; exit 0; }
  [[ $(cat /root/fa2parts/fa2site.tar.gz.part-* | sha256sum | cut -d' ' -f1) == "$sum" ]] \
    || { echo "FA2 parts do not match their manifest's checksum" >&2; exit 1; }
  torch_here=$(python3 -c 'import torch; print(torch.__version__)')
  [[ $torch_here == "$torch_saved" ]] || echo "warning: FA2 was built against torch $torch_saved, this is $torch_here" >&2
  cat /root/fa2parts/fa2site.tar.gz.part-* | tar -xzf - -C /tmp
  touch "$state/fa2-build.started" "$state/fa2-build.done"
  echo "FA2 restored into /tmp/fa2site (built against torch $torch_saved); \`stage\` will not build it"
  exit 0
  ;;
stage)
  bash .gpu/a/stage.sh
  if [[ -f $state/fa2-build.done ]]; then echo "FA2 already here (fa2-stage): not building it"; exit 0; fi
  sdist=$(ls /root/gpu-wheels/flash_attn-*.tar.gz 2> /dev/null | head -1)
  [[ -n "$sdist" ]] || { echo "no flash-attn sdist staged: FA2 will not be built" >&2; exit 0; }
  background fa2-build "MAX_JOBS=${FA2_JOBS:-20} bash /root/gpu-wheels/build-fa2.sh $sdist > /root/fa2.log 2>&1"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
  nproc
  ;;
fi-stage)
  bash scripts/install-flashinfer.sh stage
  ;;
fi)
  seed_resume; ensure_project
  bash scripts/install-flashinfer.sh || exit 1
  # Two sweeps at once, one file each, so neither waits for the other's compiles: XQA decode (the
  # TRT-LLM kernel that runs on sm_90) and FlashInfer's own kernels. Both resume from .resume/, so they
  # probe only cells with no record yet; MLA prefill first (issue #5: bf16 (256, 256) was missing).
  # trtllm-gen (ragged, context) is already recorded `unavailable`.
  # MAX_JOBS: ninja jobs per FlashInfer compile (its default is every core, in each worker).
  sweep="TIMEOUT=1500 WORKERS=${FI_WORKERS:-6} MAX_JOBS=${FI_JOBS:-4} bash scripts/h200-sweep.sh"
  timed="--timed-dtypes bfloat16"
  # nice 19: the FA2 build must not starve (session 3: 1,414 s beside FlashInfer's compiles, 858 s alone)
  NICE=19 background xqa ". /tmp/fi-env.sh; export RESULTS=sm_90-xqa; \
    $sweep trtllm_decode 900 --ops decode $timed; \
    $sweep trtllm_decode 300 --ops prefill,mla_prefill --no-timing"
  NICE=19 background fi ". /tmp/fi-env.sh; export RESULTS=sm_90-flashinfer; \
    $sweep flashinfer 1200 --dtypes bfloat16 --ops mla_prefill $timed; \
    $sweep flashinfer 900 --dtypes bfloat16 --head-dims 128,64,256 $timed; \
    $sweep flashinfer 900 --dtypes bfloat16 $timed; \
    $sweep flashinfer 900 --dtypes float16 $timed"
  ;;
fa4)
  seed_resume; ensure_project
  bash .gpu/b/install.sh || exit 1
  env_files
  ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
  background main ". /tmp/gpu-env.sh; WORKERS=$((4 * ngpu)) bash scripts/h200-sweep.sh \
    fa4,fa3,sdpa_cudnn,sdpa_flash,sdpa_efficient,sdpa_math ${MAIN_LIMIT:-900} --timed-dtypes bfloat16"
  # FA2, once built (or restored by fa2-stage), moves out of the system Python into its own folder
  # (/tmp/fa2site), which only the FA2 sweep and FA2's tests put on their path: FA2's regular `flash_attn`
  # package otherwise hides FA4's `flash_attn.cute` in every process (session 3). Then FA2's cells with no
  # record yet (carry the committed FA2 files as .resume/sm_90-fa2.jsonl), and the GPU tests: FA4 visible,
  # then FA2's with FA2 on the path. The 1-vs-all-GPU ratio is the `ratio` phase's, on SDPA.
  fa2env="PYTHONPATH=/tmp/fa2site:\$PYTHONPATH"
  background fa2 ". /tmp/gpu-env.sh; while [[ ! -f $state/fa2-build.done ]]; do sleep 2; done; tail -n 3 /root/fa2.log; \
    python3 scripts/isolate-fa2.py /tmp/fa2site; \
    $fa2env python3 -c 'import torch, flash_attn, flash_attn_2_cuda' || exit 1; \
    RESULTS=sm_90-fa2 WORKERS=$((4 * ngpu)) $fa2env bash scripts/h200-sweep.sh fa2 600 --timed-dtypes bfloat16; \
    [[ -f /tmp/fi-env.sh ]] && . /tmp/fi-env.sh; \
    timeout 600 python3 -m pytest -m gpu -v -p no:cacheprovider tests > $state/pytest-gpu.txt 2>&1; \
    $fa2env timeout 300 python3 -m pytest -m gpu -v -p no:cacheprovider -k fa2 \
      tests/test_gpu_backends.py > $state/pytest-gpu-fa2.txt 2>&1"
  ;;
ratio)
  # 1 GPU against all, GPU-bound: PyTorch's SDPA kernels need no install and compile nothing, and timing
  # inputs are drawn on the GPU (session 4 found FA2's sweeps bound by drawing them on the CPU). The same
  # cases (SDPA's whole bf16 space by default, 1,208 cases, timed) into two scratch files, 4 workers per
  # GPU each; the ratio is the two summaries' wall_s. Each run stops at RATIO_LIMIT seconds (a killed
  # run has no ratio). Session 5: 141.5 s on 1 GPU, 82.8 s on 2. A short run measures worker start-up
  # more than the GPUs: 156 cases (flash, efficient and cuDNN at head dims 64 and 128, prefill and decode)
  # gave 26.7 s against 17.6 s.
  ensure_project
  ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
  (( ngpu > 1 )) || { echo "one GPU here: no ratio to measure" >&2; exit 0; }
  args="sdpa_flash,sdpa_efficient,sdpa_cudnn,sdpa_math ${RATIO_LIMIT:-280} --dtypes bfloat16 --timed-dtypes bfloat16"
  [[ -n ${RATIO_HEAD_DIMS:-} ]] && args="$args --head-dims $RATIO_HEAD_DIMS"
  RESULTS=ratio-sdpa-1gpu GPUS=0 WORKERS=4 bash scripts/h200-sweep.sh $args
  RESULTS=ratio-sdpa-${ngpu}gpu WORKERS=$((4 * ngpu)) bash scripts/h200-sweep.sh $args
  python3 - "$state" "$ngpu" <<'PY'
import json, sys
try:
    one, many = (json.load(open(f"{sys.argv[1]}/ratio-sdpa-{n}gpu.summary.json")) for n in ("1", sys.argv[2]))
except (OSError, ValueError) as e:  # a run killed at its limit writes no summary
    sys.exit(f"no ratio: {e}")
print(f"1 GPU: {one['probed']} cases in {one['wall_s']:.1f} s; {sys.argv[2]} GPUs: {many['probed']} cases in "
      f"{many['wall_s']:.1f} s; ratio {one['wall_s'] / many['wall_s']:.2f}x")
PY
  ;;
collect)
  for _ in $(seq 1 "${WAIT:-0}"); do
    pending=0
    for s in "$state"/*.started; do [[ -f ${s%.started}.done ]] || pending=1; done
    (( pending )) || break
    sleep 1
  done
  for s in "$state"/*.started; do [[ -f ${s%.started}.done ]] && echo "done: $(basename "${s%.started}")" \
    || echo "still running: $(basename "${s%.started}")"; done
  if [[ -f /tmp/fi-env.sh && -n ${SAVE_CACHE:-} ]]; then  # FlashInfer's compiled modules, for a later session
    # (see install-flashinfer.sh); off by default: session 3's archives (58 and 30 MB) were over $OUT's 16 MiB
    bash scripts/install-flashinfer.sh save-cache "$state/fi-aot-xqa.tar.gz" 'xqa*' || true
    bash scripts/install-flashinfer.sh save-cache "$state/fi-aot-batch.tar.gz" 'batch*' || true
  fi
  ;;
*) echo "unknown phase $phase" >&2; exit 2 ;;
esac
progress
copy_out
ls -la "$OUT"
