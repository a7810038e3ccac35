#!/usr/bin/env bash
# The GPU pass: every CUDA path of ddptui on a real NVIDIA GPU, measured. Three commands, one
# device-tool call each, in this order:
#
#   benchmarks/gpu_pass.sh pass  [OUTDIR]  (<= 8 minutes, GPU_PASS_BUDGET_S 480) what the machine
#                                          has; set-up without a package index (bin/setup with
#                                          DDPTUI_WHEELS); preflight (stops here if the project
#                                          cannot import or its tests cannot be collected);
#                                          headless xlarge on gloo with CUDA tensors (2 ranks on
#                                          one GPU, 40 steps) and on NCCL (world 1), recorded into
#                                          OUTDIR; verify on both backends; the tests marked gpu;
#                                          P1; P7; NVML next to nvidia-smi; deep40 on gloo
#                                          (recorded; cut first when time is short); then
#                                          benchmarks/gpu_cost.py when present (its 3 minutes kept)
#   benchmarks/gpu_pass.sh suite [OUTDIR]  (<= 5 minutes, GPU_PASS_SUITE_BUDGET_S 300) the whole
#                                          suite with CUDA visible, as bin/test runs it on CI, in
#                                          the .venv bin/setup made (GPU_PASS_XDIST workers, 12)
#   benchmarks/gpu_pass.sh clock [OUTDIR]  alone, after the rest: the clock residual
#                                          (GPU_PASS_CLOCK_S, 900 s). It runs in a process of its
#                                          own; the command waits for it as long as its budget
#                                          allows, and `clock` again waits for the rest and
#                                          collects it (900 s: two commands)
#
# Each step's time limit is the smaller of its own and what is left of the command's budget; a
# step with too little left is skipped and says so. Results reach OUTDIR as each step ends:
# summary-PHASE.txt is appended to line by line, gpu-pass-PHASE.tar.gz re-packed after each step,
# and the pass's three recordings (the device tool brings back 8 files at most: 5 here).
#
# The machine: a Python whose `python3` is a virtual environment holding torch (the first H100
# pass: Python 3.12, torch 2.11+cu130), no package index. What it lacks comes as wheels, from
# DDPTUI_WHEELS (or GPU_PASS_WHEELS), else .whl/ (carried with the checkout), else
# shared/gpu-wheels or ../shared/gpu-wheels; bin/setup installs them with the index off into
# .venv, which sees the image's torch. GPU_PASS_PYTHON: that python (default python3).
#
# GPU_PASS_SKIP="WORDS": the pass's steps left out, by word (headless-gloo headless-nccl
# verify-nccl verify-gloo tests-gpu p1 p1-host p7 user-nccl nvml deep40 cost nccl-timing), each
# said in the summary.
# GPU_PASS_QUICK=1 rehearses the plumbing (small model, 3 steps, short clock and NVML runs, one
# test file instead of the suite); on a machine without CUDA the CUDA-only steps say so (all of
# `pass` on 2 CPU cores: ~75 s). GPU_PASS_NO_SETUP=1: no bin/setup, GPU_PASS_PYTHON as it is
# (tests/test_bench.py rehearses the pass's set-up-free path with every step skipped).
# GPU_PASS_SUITE="FILES": those test files instead of the whole suite. GPU_PASS_SUITE_MODE=target:
# the suite as the first H100 pass ran it (the wheels by `pip --target` into GPU_PASS_SITE and
# PYTHONPATH, the image's python, no venv): to reproduce what it found.
# benchmarks/gpu_replica.sh runs these on a CPU replica of the GPU machine.
set -uo pipefail
phase=${1:-pass}
out=${2:-${OUT:-gpu-pass}}
case $phase in pass|suite|clock) ;; *) echo "usage: $0 pass|suite|clock [OUTDIR]" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=${GPU_PASS_WORK:-/tmp/ddptui-gpu-pass}
site=${GPU_PASS_SITE:-/tmp/site}
mkdir -p "$work"
export OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1 DDPTUI_RUNS_DIR="$work/runs"
IMAGE_PY=${GPU_PASS_PYTHON:-python3}
PY=$IMAGE_PY
BUDGET=${GPU_PASS_BUDGET_S:-480}
[ "$phase" = suite ] && BUDGET=${GPU_PASS_SUITE_BUDGET_S:-300}
MARGIN=20  # seconds kept back from every step's limit (packing, the next step's start)
T0=$SECONDS
QUICK=${GPU_PASS_QUICK:-}
BIG=xlarge; CLOCK_S=${GPU_PASS_CLOCK_S:-900}; NVML_S=20; SUITE=${GPU_PASS_SUITE:-}
if [ -n "$QUICK" ]; then BIG=small; CLOCK_S=${GPU_PASS_CLOCK_S:-10}; NVML_S=3; SUITE=${SUITE:-tests/test_pipeline.py}; fi
n() { if [ -n "$QUICK" ] || [ "$HAS_CUDA" = 0 ]; then echo 3; else echo "$1"; fi; }  # steps (3 on CPU: the plumbing)
summary="$out/summary-$phase.txt"
: > "$summary"

step() { echo "== $(date +%T) +$((SECONDS - T0))s $*" | tee -a "$work/summary.txt" "$summary"; }
note() { echo "$*" | tee -a "$work/summary.txt" "$summary"; }
pack() {  # what the work folder holds so far, into OUTDIR (replacing the last pack)
  tar czf "$out/.gpu-pass-$phase.tar.gz" -C "$work" --exclude=runs --exclude=site . 2>/dev/null \
    && mv -f "$out/.gpu-pass-$phase.tar.gz" "$out/gpu-pass-$phase.tar.gz"
}
RESERVE=0  # seconds kept for later steps (gpu_cost.py's, while the steps before them run)
left() { echo $((BUDGET - (SECONDS - T0) - MARGIN - RESERVE)); }
# limit NAME SECONDS: this step's time limit, or 0 (and a note) when the command's budget is spent
limit() {
  local l; l=$(left)
  if [ "$l" -lt 15 ]; then note "  SKIPPED $1: the ${BUDGET}s budget is spent" >&2; echo 0; return; fi
  if [ "$2" -lt "$l" ]; then echo "$2"; else echo "$l"; fi
}
SKIP=" ${GPU_PASS_SKIP:-} "
skipped() {  # skipped WORD: true (and a note) when GPU_PASS_SKIP names this step
  case $SKIP in *" $1 "*) note "  SKIPPED $1 (GPU_PASS_SKIP)"; return 0 ;; esac; return 1
}
HAS_CUDA=0 DEV=cpu CPUQ=
on_cpu_note() {  # without CUDA, the steps that can run on CPU do: the plumbing, not the figures
  [ "$HAS_CUDA" = 1 ] || note "  no CUDA here: $1 on CPU (rehearsing the plumbing, not the GPU's figures)"
}
cuda_only() {  # says so when a CUDA-only step cannot run here
  [ "$HAS_CUDA" = 1 ] && return 0
  note "  CUDA-only, skipped: no CUDA device here ($1)"; return 1
}

find_wheels() {
  local w=${DDPTUI_WHEELS:-${GPU_PASS_WHEELS:-}}
  if [ -z "$w" ]; then
    for d in .whl shared/gpu-wheels ../shared/gpu-wheels; do
      if ls "$d"/*.whl >/dev/null 2>&1; then w=$d; break; fi
    done
  fi
  echo "$w"
}

# the project and what the image lacks, the package index off: bin/setup makes .venv (seeing
# the image's torch) and installs from the wheels; every later step runs .venv's python
deps() {
  step "set-up without a package index (bin/setup)"
  local wheels; wheels=$(find_wheels)
  [ -n "$wheels" ] || note "  no wheels found (DDPTUI_WHEELS, .whl/, shared/gpu-wheels): the image's packages only"
  if PIP_NO_INDEX=1 PYTHON=$IMAGE_PY DDPTUI_WHEELS=$wheels timeout 240 bin/setup '[test]' > "$work/setup.txt" 2>&1; then
    PY=$PWD/.venv/bin/python
    note "  exit 0 · wheels: ${wheels:-none} · $(grep -m 1 "virtual environment" "$work/setup.txt")"
  else
    note "  SET-UP FAILED: $(tail -n 3 "$work/setup.txt" | tr '\n' ' ')"
    return 1
  fi
}

# the first H100 pass's way, kept to reproduce what it found: the wheels by pip --target and
# PYTHONPATH, the image's own python
deps_target() {
  step "dependencies by pip --target and PYTHONPATH (the first H100 pass's way)"
  local wheels; wheels=$(find_wheels)
  PIP_NO_INDEX=1 $IMAGE_PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "$wheels"/*.whl > "$work/pip.txt" 2>&1
  note "  wheels from $wheels: exit $?"
  export PYTHONPATH=$site:$PWD
  PY=$IMAGE_PY
}

env_report() {
  step "environment"
  { nvidia-smi 2>&1 || echo "nvidia-smi: not here"; $PY - <<'EOF'
import importlib, platform
import torch
print("python", platform.python_version())
print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
for m in ("msgspec", "ijson", "textual", "rich", "msgpack", "psutil", "pynvml", "aiohttp", "jinja2",
          "aiohttp_jinja2", "textual_serve", "pytest", "xdist", "pytest_timeout", "hypothesis",
          "syrupy", "pytest_asyncio", "ddptui"):
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, "__version__", "present"))
    except Exception as e:  # noqa: BLE001
        print(m, "MISSING", type(e).__name__, e)
EOF
  } > "$work/env-$phase.txt" 2>&1
  grep -E "^(python|torch)|MISSING" "$work/env-$phase.txt" | tee -a "$work/summary.txt" "$summary"
  $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && { HAS_CUDA=1; DEV=cuda; }
  if [ "$HAS_CUDA" = 0 ] && [ -z "$QUICK" ]; then  # CPU: the plumbing on the small model, short
    BIG=small; CPUQ=--quick
  fi
}

# the pass is worth nothing if the project cannot start or its tests cannot be collected: check
# first, in seconds, and stop there rather than spend the GPU's minutes on nothing
preflight() {
  step "preflight: the project imports and the suite collects"
  local bad=0
  $PY -c "import ddptui.cli.main, ddptui.recording.kineto, ddptui.cli.serve, ranks.builtin.worker, msgspec, ijson" \
    > "$work/preflight.txt" 2>&1 || bad=1
  timeout 120 $PY -m pytest -q --collect-only -p no:cacheprovider tests > "$work/collect.txt" 2>&1 || bad=1
  note "  $(tail -n 1 "$work/collect.txt")"
  # every package pyproject.toml asks for (its dependencies and the test extra), by name and
  # version: one missing stops the pass here, named (an extra is imported by one test only:
  # the rest of the suite would have run without it and that test failed late)
  if ! $PY benchmarks/gpu_pass_needs.py > "$work/needs.txt" 2>&1; then
    note "  PREFLIGHT FAILED: $(tr '\n' ' ' < "$work/needs.txt")"
    return 1
  fi
  if [ "$bad" = 1 ]; then
    note "  PREFLIGHT FAILED: $(grep -m 3 -E "Error|error" "$work/preflight.txt" "$work/collect.txt" | tr '\n' ' ')"
    return 1
  fi
}

headless() {  # name, own limit, then ddptui options; recorded into OUTDIR as NAME.ddptui
  local name=$1 own=$2; shift 2
  local t; t=$(limit "headless $name" "$own"); [ "$t" = 0 ] && return
  step "headless $name (limit ${t}s): $*"
  DDPTUI_SYNC_DEBUG="$work/sync-$name" timeout "$t" $PY -m ddptui.cli.main --headless --device $DEV "$@" \
    --record "$out/$name.ddptui" --json "$work/headless-$name.json" \
    > "$work/headless-$name.txt" 2> "$work/headless-$name.err"
  note "  exit $? · $(tail -n 3 "$work/headless-$name.txt" | tr '\n' ' ')"
  $PY - "$work/sync-$name" <<'EOF' | tee -a "$work/summary.txt" "$summary"
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/rank*.json")):
    d = json.load(open(f))
    print(f"  sync probe rank {d['rank']}: {d['measured_steps']} measured steps, "
          f"{sum(v['count'] for v in d['syncs'].values())} synchronizes inside them; "
          f"CUDA events allocated {d['events_allocated']}, pooled {d['events_pooled']}")
    for k, v in list(d["syncs"].items())[:5]:
        print(f"    {v['count']}x {k}")
EOF
  pack
}

verify() {
  local name=$1; shift
  local t; t=$(limit "verify $name" 100); [ "$t" = 0 ] && return
  step "verify $name (limit ${t}s): $*"
  timeout "$t" $PY -m ddptui.cli.main verify --device $DEV "$@" --json "$work/verify-$name.json" > "$work/verify-$name.txt" 2>&1
  note "  exit $?"
  grep -E "^(naive|interleaved|ddp|single) |note:" "$work/verify-$name.txt" | head -n 24 >> "$summary"
  pack
}

timed() {  # name, own limit, log file, command...: a step whose last lines go to the summary
  local name=$1 own=$2 log=$3; shift 3
  local t; t=$(limit "$name" "$own"); [ "$t" = 0 ] && return
  step "$name (limit ${t}s)"
  timeout "$t" "$@" > "$work/$log" 2>&1
  note "  exit $? · $(grep -E '^P[0-9]| ratio|side by side| passed| failed| errors? | skipped| deselected|^now|share of the step|^gpu_' "$work/$log" | tail -n 4 | tr '\n' ' ')"
  pack
}

phase_pass() {
  # gpu_cost.py's steps, last, keep their time (120 s, and 60 s for --nccl-timing on CUDA): the
  # steps before them are cut first
  [ -f benchmarks/gpu_cost.py ] && RESERVE=180
  if [ -n "${GPU_PASS_NO_SETUP:-}" ]; then  # (the suite's rehearsal: GPU_PASS_PYTHON as it is)
    step "set-up skipped (GPU_PASS_NO_SETUP): $PY as it is"
  else
    deps || { pack; return 1; }
  fi
  env_report
  preflight || { pack; return 1; }
  local s="naive,interleaved,ddp,single" g
  on_cpu_note "the headless runs"
  # the talk's run: two ranks sharing one GPU over gloo (its recording is demo/'s), then NCCL
  skipped headless-gloo || headless $BIG-2ranks-gloo-$DEV 70 --gpus 1 --ranks 2 --model $BIG --strategies $s --steps "$(n 40)"
  skipped headless-nccl || headless $BIG-1rank-nccl-$DEV 45 --gpus 1 --model $BIG --strategies $s --steps "$(n 20)"
  # world 1 on NCCL: verify says communication is not checked and checks compute
  skipped verify-nccl || verify nccl --gpus 1 --model $BIG --strategies $s --steps 6
  # gloo with CUDA tensors: AllReduce ends are compared with the end of the copy back
  skipped verify-gloo || verify gloo --gpus 1 --ranks 2 --model small --strategies naive,interleaved,ddp --steps 6
  skipped tests-gpu || timed "tests marked gpu" 75 tests-gpu.txt $PY -m pytest -q -m gpu -p no:cacheprovider tests
  on_cpu_note "P1 and P7"
  # both ways of timing DDP's buckets, back to back: NCCL's own timing (the default on NCCL)
  # and the comm hook, each beside torch.profiler
  skipped p1 || timed "P1 on $BIG (1 rank, NCCL), buckets by NCCL's own timing" 70 p1.txt \
    $PY benchmarks/p1_overhead.py --model $BIG --device $DEV --ranks 1 --steps 90 ${QUICK:+--quick} $CPUQ
  skipped p1 || timed "P1 on $BIG (1 rank, NCCL), buckets by the comm hook" 70 p1-hook.txt \
    $PY benchmarks/p1_overhead.py --model $BIG --device $DEV --ranks 1 --steps 90 --comm-timing comm-hook ${QUICK:+--quick} $CPUQ
  # host-bound (small layers, batch 16: a step of a few ms): what reading the Flight Recorder
  # costs a step the host's own work bounds (the sender thread's dumps take the GIL)
  skipped p1-host || timed "P1 host-bound (small, batch 16, 1 rank, NCCL), buckets by NCCL's own timing" 45 p1-host.txt \
    $PY benchmarks/p1_overhead.py --model small --host-bound --device $DEV --ranks 1 --steps 120 ${QUICK:+--quick} $CPUQ
  skipped p7 || timed "P7 hook cost and host share with real CUDA events" 60 p7.txt \
    $PY benchmarks/p7_hook_cost.py --device $DEV ${QUICK:+--quick} $CPUQ
  # a user's own DDP script on NCCL (`ddptui run --auto`): gradient accumulation (no_sync and
  # the sync flag), find_unused_parameters (a DDP that never rebuilds its buckets); its buckets
  # timed by NCCL's own timing, none untimed
  if ! skipped user-nccl && cuda_only "a user's script on NCCL"; then
    timed "a user's DDP script on NCCL (ddptui run --auto, accumulation)" 60 user-nccl.txt \
      $PY -m ddptui.cli.main run --auto --headless --nproc-per-node 1 --json "$work/user-nccl.json" \
      -- tests/scripts/accumulate.py --cuda --iters 12 --micro 2
    $PY -c 'import json, sys
d = json.load(open(sys.argv[1]))["strategies"][0]
print("  user-nccl:", {k: d.get(k) for k in ("steps", "comm_ms", "bucket_timing")})' "$work/user-nccl.json" \
      >> "$summary" 2>&1 || note "  user-nccl: no JSON"
  fi
  if ! skipped nvml && cuda_only "NVML next to nvidia-smi"; then
    timed "NVML next to nvidia-smi" 35 nvml.txt $PY benchmarks/gpu_nvml.py --seconds $NVML_S --out "$work/nvml.csv"
  fi
  # last before gpu_cost: the step cut first when time is short
  g=deep40; [ -n "$QUICK$CPUQ" ] && g=small-b
  skipped deep40 || headless $g-2ranks-gloo-$DEV 55 --gpus 1 --ranks 2 --model "${g%-b}" --strategies naive,ddp --steps "$(n 8)"
  # ======== STEP FOR benchmarks/gpu_cost.py: <= 2 minutes, right after the pass; skipped while
  # ======== the file is absent. Called as gpu_clock.py and gpu_nvml.py are (--out FILE); its
  # ======== output goes to the work folder, packed with the rest, its last lines to the summary.
  RESERVE=0
  if [ -f benchmarks/gpu_cost.py ]; then
    skipped cost || timed "gpu_cost (benchmarks/gpu_cost.py)" 120 gpu-cost.txt \
      $PY benchmarks/gpu_cost.py --out "$work/gpu-cost.json"
    if ! skipped nccl-timing && cuda_only "gpu_nccl_timing"; then  # PyTorch's own timing of NCCL collectives
      timed "gpu_nccl_timing (PyTorch's own NCCL timing, the completion hook, the Flight Recorder)" 60 \
        gpu-nccl-timing.txt $PY benchmarks/gpu_nccl_timing.py --out "$work/gpu-nccl-timing.json"
      grep -E "^register|^  " "$work/gpu-nccl-timing.txt" | head -n 24 >> "$summary"
    fi
  else
    note "  benchmarks/gpu_cost.py: absent, skipped"
  fi
}

phase_suite() {
  local t
  if [ "${GPU_PASS_SUITE_MODE:-}" = target ]; then
    deps_target
    env_report
    local x=(); $PY -c "import xdist" 2>/dev/null && x=(-n "${GPU_PASS_XDIST:-12}")
    # shellcheck disable=SC2086
    timed "the suite as the first H100 pass ran it (pip --target, PYTHONPATH)" $((BUDGET - 30)) tests-all.txt \
      $PY -m pytest -q -p no:cacheprovider "${x[@]}" -m "not serial" ${SUITE:-tests}
    grep -E "^(FAILED|ERROR) " "$work/tests-all.txt" | head -n 40 >> "$summary"
    note "  No module named 'msgspec': $(grep -c "No module named 'msgspec'" "$work/tests-all.txt"); 'GPU(s) present': $(grep -c "GPU(s) present" "$work/tests-all.txt")"
    return 0
  fi
  deps || { pack; return 1; }
  env_report
  t=$(limit "the suite" $((BUDGET - 30)))
  [ "$t" = 0 ] && return 0
  step "the suite with CUDA visible, as bin/test runs it: ${SUITE:-(all)} (limit ${t}s)"
  # bin/test's two runs (the rest on GPU_PASS_XDIST workers, then the serial tests), each
  # stopped by SIGINT at the limit so pytest still prints what failed so far (-rfE)
  local x=(-n "${GPU_PASS_XDIST:-12}" --dist loadgroup) status=0 serial
  if [ -n "$SUITE" ]; then
    # shellcheck disable=SC2086
    timeout -s INT -k 30 "$t" .venv/bin/python -m pytest -q -rfE -p no:cacheprovider "${x[@]}" $SUITE \
      > "$work/tests-all.txt" 2>&1 || status=$?
  else
    timeout -s INT -k 30 "$t" .venv/bin/python -m pytest -q -rfE -p no:cacheprovider -m "not serial" "${x[@]}" \
      --durations=15 > "$work/tests-all.txt" 2>&1 || status=$?
    mapfile -t serial < <(grep -l "mark\.serial" tests/test_*.py)
    t=$(limit "the serial tests" 120)
    if [ "$t" != 0 ]; then
      timeout -s INT -k 30 "$t" .venv/bin/python -m pytest -q -rfE -p no:cacheprovider -m serial "${serial[@]}" \
        >> "$work/tests-all.txt" 2>&1 || { s=$?; [ "$status" = 0 ] && status=$s; }
    fi
  fi
  note "  exit $status · $(grep -E ' passed| failed| errors? |no tests ran|Interrupted' "$work/tests-all.txt" | tail -n 3 | tr '\n' ' ')"
  grep -E "^(FAILED|ERROR) " "$work/tests-all.txt" | head -n 40 >> "$summary"
  pack
}

# alone, after everything else: nothing else may share the GPU or the cores while it runs
phase_clock() {
  if [ -x .venv/bin/python ]; then PY=$PWD/.venv/bin/python; else deps || return 1; fi
  env_report
  cuda_only "the clock residual" || return 0
  local pid; pid=$(cat "$work/clock.pid" 2>/dev/null)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    step "clock residual run: waiting for the one started before"
  elif [ -f "$work/clock.done" ]; then
    note "  done before: $(tail -n 1 "$work/clock.log")"; pack; return 0
  else
    step "clock residual run ($CLOCK_S s, in a process of its own)"
    setsid nohup $PY benchmarks/gpu_clock.py --seconds "$CLOCK_S" --out "$work/clock.csv" \
      > "$work/clock.log" 2>&1 < /dev/null &
    pid=$!
    echo $pid > "$work/clock.pid"
  fi
  while kill -0 "$pid" 2>/dev/null && [ "$(left)" -gt 5 ]; do sleep 5; done
  local rows; rows=$(($(wc -l < "$work/clock.csv" 2>/dev/null || echo 1) - 1))
  if kill -0 "$pid" 2>/dev/null; then
    note "  still running: $rows probes so far; run \`$0 clock\` again to wait for the rest"
  else
    note "  done: $(tail -n 1 "$work/clock.log")"
    touch "$work/clock.done"
  fi
  pack
}

case $phase in
  pass) phase_pass ;;
  suite) phase_suite ;;
  clock) phase_clock ;;
esac
rc=$?
note "$phase: $((SECONDS - T0)) s of its ${BUDGET} s"
pack
echo "gpu pass ($phase): $summary, $out/gpu-pass-$phase.tar.gz"
exit $rc
