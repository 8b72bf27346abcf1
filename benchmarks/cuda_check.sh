#!/usr/bin/env bash
# Every GPU path of the auditor in one call on a lent GPU machine (docs/cuda.md says how to run
# it and how to commit what comes back):
#   1. a venv over the machine's own CUDA torch (it cannot reach a registry), the project in it;
#   2. the CUDA tests: `pytest -m cuda`, then the tests that skip without CUDA;
#   3. `auditor gradprobe --device cuda` for the baseline and lean, projected to Mistral-7B;
#      `auditor train-step --device cuda` on TinyStories-33M and GPT-Neo-125M, sequence 128, 512,
#      2048, fp32 and amp-bf16 (forward only against the full step; a memory_viz pickle per run);
#      beside them (each on half the cores) the same GradProbe runs on the machine's CPU; then the
#      side by side of the four records (benchmarks/cuda_side_by_side.py);
#   4. everything packed under $OUT: cuda-check.log, summary.md, side-by-side.md,
#      train-step-cuda.md and results.tar.gz (split in 15 MiB parts if larger: results.tar.gz.partNN).
# Each step runs under `timeout -s INT` (the auditor writes a partial report on SIGINT); a failed
# step is logged and the script goes on; the whole stays within BUDGET_S (default 480 s).
#
#   OUT=/tmp/out bash benchmarks/cuda_check.sh                       # on the GPU machine
#   DEVICE=cpu PYTHON=.venv/bin/python OUT=/tmp/dry bash benchmarks/cuda_check.sh   # dry run here
#
# DEVICE=cpu is the dry run: tiny model sizes, the "GPU side" run on the CPU, the same steps.
# Settings (environment): DEVICE (cuda), PYTHON (python3: the interpreter holding torch),
# WHEELS (.whl: wheels installed into the venv first, e.g. memray, which the image lacks),
# BUDGET_S (480), WORK (runs/cuda-check: run folders, relative so records name no machine),
# VENV (/tmp/cuda-check-venv), TARGET (the projection's; mistral-7b, tinystories-33m in the dry run).
set -u
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
BUDGET_S=${BUDGET_S:-480}
WORK=${WORK:-runs/cuda-check}
VENV=${VENV:-/tmp/cuda-check-venv}
TARGET=${TARGET:-}
if [ -z "${OUT:-}" ]; then OUT=$(mktemp -d); fi
export PYTHONUNBUFFERED=1
case "$DEVICE" in
  cpu) DRY=1 ;;
  cuda|cuda:[0-9]*) DRY=0 ;;
  *) echo "cuda_check.sh: DEVICE must be cuda, cuda:N or cpu (the dry run), not '$DEVICE'" >&2; exit 2 ;;
esac
if [ -e "$WORK" ]; then
  echo "cuda_check.sh: $WORK already exists; move it away or set WORK (run folders are never reused)" >&2; exit 2
fi
mkdir -p "$OUT" "$WORK"
LOG=$OUT/cuda-check.log
STEPS=$WORK/steps.tsv
: >"$LOG"; : >"$STEPS"
START=$(date +%s)

log() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }

# step NAME LIMIT_S COMMAND...: runs it under timeout (no more than the budget left), logs its
# output and how it ended; never stops the script.
step() {
  local name=$1 limit=$2; shift 2
  local remaining shown; remaining=$(left); shown=$(printf '%q ' "$@")
  if [ "$remaining" -lt 15 ]; then
    log "SKIP $name: budget of ${BUDGET_S}s spent"
    printf '%s\tskipped (budget spent)\t0\t%s\n' "$name" "${shown% }" >>"$STEPS"; return 0
  fi
  [ "$limit" -gt "$remaining" ] && limit=$remaining
  log "RUN  $name (limit ${limit}s): ${shown% }"
  local t0 rc status; t0=$(date +%s)
  timeout -s INT -k 20 "$limit" "$@" >>"$LOG" 2>&1; rc=$?
  case $rc in
    0) status=ok ;;
    124|137) status="timed out after ${limit}s" ;;
    *) status="failed (exit $rc)" ;;
  esac
  log "END  $name: $status in $(( $(date +%s) - t0 ))s"
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$(( $(date +%s) - t0 ))" "${shown% }" >>"$STEPS"
  return 0
}

# skip NAME WHY: a step that cannot run, said in the summary.
skip() {
  log "SKIP $1: $2"; printf '%s\tskipped (%s)\t0\t-\n' "$1" "$2" >>"$STEPS"
}

# -- 1. the machine and the venv ----------------------------------------------------------------
log "cuda_check.sh: DEVICE=$DEVICE (dry run: $DRY), budget ${BUDGET_S}s, run folders in $WORK"
{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; \
  nproc; free -g | head -2; } >>"$LOG" 2>&1
# The machine has no registry: the venv sees the interpreter's own packages (its CUDA torch,
# transformers...) through a .pth file, so pip installs nothing but the wheels given and the project.
if ! "$PYTHON" -c 'import torch' >>"$LOG" 2>&1; then
  log "FATAL: $PYTHON has no torch; set PYTHON to the interpreter that holds the machine's torch"
fi
rm -rf "$VENV"
if "$PYTHON" -m venv --without-pip "$VENV" >>"$LOG" 2>&1; then
  PY=$VENV/bin/python
  SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$PYTHON" -c 'import site, sys; print("\n".join(p for p in site.getsitepackages() + [site.getusersitepackages()]))' \
    >"$SITE/base-interpreter.pth"
else
  log "no venv could be made ($PYTHON -m venv failed): installing into $PYTHON's own environment"
  PY=$PYTHON
fi
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  step "install wheels from $WHEELS" 120 "$PY" -m pip install -q --no-index --no-deps --no-compile "$WHEELS"/*.whl
fi
step "install the project" 180 "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e .
if "$PY" -c 'import auditor.cli' >>"$LOG" 2>&1 && [ -x "$(dirname "$PY")/auditor" ]; then
  AUDITOR=("$(dirname "$PY")/auditor"); PLUGIN=()
else  # the install failed: the project from its folder, the pytest plugin named by hand
  log "the project is not installed: running it from the source folder (PYTHONPATH)"
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  AUDITOR=("$PY" -m auditor); PLUGIN=(-p auditor.pytest_plugin)  # its entry point is not installed
fi
"$PY" - >>"$LOG" 2>&1 <<'EOF'
import importlib, torch
print("torch", torch.__version__, "built for CUDA", torch.version.cuda, "cuda available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(), "memory", torch.cuda.get_device_properties(0).total_memory)
for name in ("transformers", "psutil", "safetensors", "matplotlib", "rich", "memray", "pytest", "numpy"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as error:
        print(name, "MISSING:", error)
EOF
CUDA_OK=0
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then CUDA_OK=1; fi
if [ "$DRY" = 0 ] && [ "$CUDA_OK" = 0 ]; then
  log "NO CUDA TORCH: $PY's torch cannot use a GPU (see the versions above); every CUDA step is skipped," \
      "the CPU side still runs. Carry a CUDA torch wheel in $WHEELS or set PYTHON to the interpreter that has one."
fi
MEMRAY=()
if ! "$PY" -c 'import memray' 2>/dev/null; then
  MEMRAY=(--no-memray)
  log "memray is not importable: the gradprobe runs use --no-memray (no allocation sites in their reports)"
fi
GPU_READY=$(( DRY == 1 || CUDA_OK == 1 ))

# -- sizes: the real ones on the GPU machine, tiny ones for the dry run -------------------------
if [ "$DRY" = 1 ]; then
  TINY=(--layers 1 --hidden 64 --heads 2 --intermediate 128 --vocab 512)
  GP_ARGS=(--arch tinystories-33m "${TINY[@]}" --seq-len 32)
  TS_ARGS=(--arch tinystories-33m "${TINY[@]}" --seq-len 32 64 --precision fp32 amp-bf16 --steps 2 --accumulation 1)
  TARGET=${TARGET:-tinystories-33m}  # the full-size model: tracing Mistral-7B takes minutes on a small CPU
  GP_LIMIT=400; TS_LIMIT=400; TEST_LIMIT=300
else
  GP_ARGS=(--arch tinystories-33m --seq-len 128)
  TS_ARGS=(--arch tinystories-33m gpt-neo-125m --seq-len 128 512 2048 --precision fp32 amp-bf16 --steps 6 --accumulation 2)
  TARGET=${TARGET:-mistral-7b}
  GP_LIMIT=120; TS_LIMIT=240; TEST_LIMIT=90
fi

# -- 2. the CUDA tests ---------------------------------------------------------------------------
mkdir -p "$WORK/tests"
if [ "$GPU_READY" = 1 ]; then
  step "pytest -m cuda" "$TEST_LIMIT" "$PY" -m pytest -q -rs -p no:cacheprovider --continue-on-collection-errors "${PLUGIN[@]}" \
    -m cuda --junitxml="$WORK/tests/cuda-marked.xml" tests
  # the tests that skip without CUDA but carry no marker (found by their skip condition)
  mapfile -t SKIPPING < <(grep -l 'cuda.is_available()' tests/test_*.py)
  step "pytest -k cuda (tests that skip without CUDA)" "$TEST_LIMIT" "$PY" -m pytest -q -rs -p no:cacheprovider --continue-on-collection-errors \
    "${PLUGIN[@]}" -m 'not cuda' -k cuda --junitxml="$WORK/tests/cuda-skipping.xml" "${SKIPPING[@]}"
else
  skip "CUDA tests" "no CUDA torch"
fi

# -- 3. GradProbe on the GPU, then training steps on the GPU beside GradProbe on the CPU ---------
gradprobe() {  # gradprobe SIDE DEVICE VARIANT [EXTRA...], prefixed by PIN (taskset) if set
  local side=$1 device=$2 variant=$3 dir=$WORK/gradprobe-$1-$3; shift 3
  step "gradprobe $variant on $device ($side side)" "$GP_LIMIT" "${PIN[@]}" "${AUDITOR[@]}" gradprobe \
    "${GP_ARGS[@]}" --variant "$variant" --device "$device" --target "$TARGET" "${MEMRAY[@]}" "$@" \
    --run-dir "$dir" -o "$WORK/gradprobe-$side-$variant.md"
}
PIN=()
for variant in baseline lean; do
  if [ "$GPU_READY" = 1 ]; then gradprobe gpu "$DEVICE" "$variant"; else skip "gradprobe $variant on cuda" "no CUDA torch"; fi
done

# The CPU side (the same GradProbe workload, without the traced projection that the GPU runs made,
# minutes more here) runs beside the training steps, each on its own half of the cores (taskset),
# its torch threads that half: neither waits for the other, and the CPU side's time is its own.
CORES=$(nproc)
if command -v taskset >/dev/null && [ "$CORES" -ge 2 ]; then
  HALF=$(( CORES / 2 ))
  GPU_PIN=(taskset -c "0-$(( HALF - 1 ))"); CPU_PIN=(taskset -c "$HALF-$(( CORES - 1 ))"); CPU_THREADS=$(( CORES - HALF ))
else
  GPU_PIN=(); CPU_PIN=(); CPU_THREADS=$CORES
fi
cpu_side() {
  PIN=("${CPU_PIN[@]}")
  for variant in baseline lean; do gradprobe cpu cpu "$variant" --no-trace --threads "$CPU_THREADS"; done
}
CPU_JOB=
if [ "${#CPU_PIN[@]}" -gt 0 ]; then
  set -m; cpu_side & CPU_JOB=$!; set +m  # job control: the background runs still take SIGINT at a timeout
fi

# training steps (memory_viz snapshots on CUDA); 40 s of the budget stay for the side by side and packing
if [ "$GPU_READY" = 1 ]; then
  limit=$(( $(left) - 40 )); [ "$limit" -gt "$TS_LIMIT" ] && limit=$TS_LIMIT; [ "$limit" -lt 15 ] && limit=15
  PIN=("${GPU_PIN[@]}")
  step "train-step on $DEVICE" "$limit" "${PIN[@]}" "${AUDITOR[@]}" train-step "${TS_ARGS[@]}" --device "$DEVICE" \
    --run-dir "$WORK/train-step-runs" -o "$WORK/train-step-cuda.md"
else
  skip "train-step on cuda" "no CUDA torch"
fi
if [ -n "$CPU_JOB" ]; then wait "$CPU_JOB"; else cpu_side; fi

GP_RUNS=()
for dir in "$WORK"/gradprobe-gpu-baseline "$WORK"/gradprobe-gpu-lean "$WORK"/gradprobe-cpu-baseline "$WORK"/gradprobe-cpu-lean; do
  [ -f "$dir/run.json" ] && GP_RUNS+=("$dir")
done
if [ "${#GP_RUNS[@]}" -gt 0 ]; then
  step "side by side" 60 "$PY" benchmarks/cuda_side_by_side.py "${GP_RUNS[@]}" -o "$WORK/side-by-side.md"
else
  skip "side by side" "no gradprobe run left a record"
fi

# -- 4. summary and packing ------------------------------------------------------------------------
# the venv's and the machine's interpreter folders both become <python> (the libraries live in the latter)
"$PY" -m auditor.portable_paths "$WORK" >>"$LOG" 2>&1 || log "portable_paths failed: records keep this machine's folders"
PYTHONPATH=$PWD "$PYTHON" -m auditor.portable_paths "$WORK" >>"$LOG" 2>&1 \
  || log "portable_paths under $PYTHON failed: records may name its folder"
{
  echo "# cuda_check.sh: DEVICE=$DEVICE$([ "$DRY" = 1 ] && echo ' (dry run, tiny sizes)')"
  echo
  echo "$(grep -c $'\tok\t' "$STEPS") of $(wc -l <"$STEPS") steps ok in $(( $(date +%s) - START )) s (budget ${BUDGET_S} s)."
  grep -m1 '^torch ' "$LOG" | sed 's/^/Python side: /'
  echo
  echo "| step | how it ended | seconds | command |"
  echo "|---|---|---:|---|"
  while IFS=$'\t' read -r name status secs cmd; do
    cmd=${cmd//$VENV\/bin\//}  # the venv's python and auditor, named plainly
    echo "| $name | $status | $secs | \`${cmd//$PWD\//}\` |"
  done <"$STEPS"
  for xml in "$WORK"/tests/*.xml; do
    [ -f "$xml" ] && "$PY" - "$xml" <<'EOF'
import sys, xml.etree.ElementTree as ET
suite = ET.parse(sys.argv[1]).getroot()
suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
a = suite.attrib
print(f"\n{sys.argv[1].rsplit('/', 1)[-1]}: {a.get('tests')} tests, {a.get('failures')} failed, "
      f"{a.get('errors')} errors, {a.get('skipped')} skipped, {float(a.get('time', 0)):.1f} s")
EOF
  done
} >"$WORK/summary.md"
cp "$WORK/summary.md" "$OUT/summary.md"
for report in side-by-side.md train-step-cuda.md; do
  [ -f "$WORK/$report" ] && cp "$WORK/$report" "$OUT/$report"
done
cp "$LOG" "$WORK/cuda-check.log"
# One archive of the run folders, in 15 MiB parts (the machine returns at most 8 files of 16 MiB);
# past 45 MiB, memray traces then memory_viz pickles are left out (listed in the log).
"$PY" - "$WORK" "$OUT/results.tar.gz" >>"$LOG" 2>&1 <<'EOF'
import os, sys, tarfile
work, archive = sys.argv[1], sys.argv[2]
LIMIT, PART = 45 * 2**20, 15 * 2**20
files = sorted((os.path.join(d, f) for d, _, fs in os.walk(work) for f in fs), key=lambda p: (
    p.endswith(".bin") or p.endswith(".html"), p.endswith(".pickle"), os.path.getsize(p)))
left_out = []
with open(archive, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
    for path in files:
        if raw.tell() + os.path.getsize(path) // 4 > LIMIT and (path.endswith((".bin", ".html", ".pickle"))):
            left_out.append(path); continue
        tar.add(path)
size = os.path.getsize(archive)
print(f"results.tar.gz: {len(files) - len(left_out)} files, {size / 2**20:.1f} MiB; left out: {left_out or 'none'}")
if size > PART:
    with open(archive, "rb") as whole:
        for n, chunk in enumerate(iter(lambda: whole.read(PART), b"")):
            with open(f"{archive}.part{n:02d}", "wb") as part:
                part.write(chunk)
    os.remove(archive)
    print("split into parts: cat results.tar.gz.part* > results.tar.gz")
EOF
log "done in $(( $(date +%s) - START ))s: $(ls "$OUT" | tr '\n' ' ')"
