#!/usr/bin/env bash
# The GPU pass: every CUDA path of ddptui on a real NVIDIA GPU, measured, in phases that each end
# within GPU_PASS_BUDGET_S (480 s: a 10-minute command with 2 minutes to spare), run one command
# each, in this order:
#
#   benchmarks/gpu_pass.sh a     [OUTDIR]  what the machine has (stops here if the project cannot
#                                          import or its tests cannot be collected); tests marked
#                                          gpu; headless NCCL (world 1) and gloo with CUDA tensors
#                                          (2 ranks on one GPU) on small, xlarge and deep40, each
#                                          with the sync probe
#   benchmarks/gpu_pass.sh b     [OUTDIR]  verify on both backends (NCCL at world 1: compute only;
#                                          gloo-CUDA: AllReduce ends against the copy back); P1 on
#                                          xlarge and host-bound; P7 with real CUDA events
#   benchmarks/gpu_pass.sh c     [OUTDIR]  the whole suite with CUDA visible; NVML next to
#                                          nvidia-smi; 1,000 steps (event pool); the live UI in
#                                          tmux
#   benchmarks/gpu_pass.sh clock [OUTDIR]  alone, after the rest: the clock residual
#                                          (GPU_PASS_CLOCK_S, 900 s). It runs in a process of its
#                                          own; the command waits for it as long as its budget
#                                          allows, and `clock` again waits for the rest and
#                                          collects it (900 s: two commands)
#
# Each step's time limit is the smaller of its own and what is left of the phase's budget; a
# step with too little left is skipped and says so. Results reach OUTDIR as each step ends:
# summary-PHASE.txt is appended to line by line, gpu-pass-PHASE.tar.gz re-packed after each step
# (two files a phase: the device tool brings back 8 files at most).
#
# GPU_PASS_QUICK=1 rehearses the plumbing (small model, 3 steps, short clock and NVML runs, one
# test file instead of the suite); on a machine without CUDA the CUDA-only steps say so.
# benchmarks/gpu_replica.sh runs the phases on a CPU replica of the GPU machine.
#
# OUTDIR defaults to $OUT (the device tool's folder) or ./gpu-pass. What the machine's image lacks
# comes as wheels, installed with the package index off (pip --no-index), from GPU_PASS_WHEELS,
# else .whl/ (carried with the checkout), else shared/gpu-wheels or ../shared/gpu-wheels.
set -uo pipefail
phase=${1:-a}
out=${2:-${OUT:-gpu-pass}}
cd "$(dirname "$0")/.."
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=${GPU_PASS_WORK:-/tmp/ddptui-gpu-pass}
site=${GPU_PASS_SITE:-/tmp/site}
mkdir -p "$work"
export OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1 DDPTUI_RUNS_DIR="$work/runs"
PY=${GPU_PASS_PYTHON:-python3}
BUDGET=${GPU_PASS_BUDGET_S:-480}
MARGIN=20  # seconds kept back from every step's limit (packing, the next step's start)
T0=$SECONDS
DDPTUI=($PY -m ddptui.cli.main)
QUICK=${GPU_PASS_QUICK:-}
BIG=xlarge; CLOCK_S=${GPU_PASS_CLOCK_S:-900}; NVML_S=20; POOL=1000; SUITE=tests
if [ -n "$QUICK" ]; then BIG=small; CLOCK_S=${GPU_PASS_CLOCK_S:-10}; NVML_S=3; POOL=20; SUITE=tests/test_pipeline.py; fi
n() { if [ -n "$QUICK" ] || [ "$HAS_CUDA" = 0 ]; then echo 3; else echo "$1"; fi; }  # steps (3 on CPU: the plumbing)
summary="$out/summary-$phase.txt"
: > "$summary"

step() { echo "== $(date +%T) +$((SECONDS - T0))s $*" | tee -a "$work/summary.txt" "$summary"; }
note() { echo "$*" | tee -a "$work/summary.txt" "$summary"; }
pack() {  # what the work folder holds so far, into OUTDIR (replacing the last pack)
  tar czf "$out/.gpu-pass-$phase.tar.gz" -C "$work" --exclude=runs --exclude=site . 2>/dev/null \
    && mv -f "$out/.gpu-pass-$phase.tar.gz" "$out/gpu-pass-$phase.tar.gz"
}
left() { echo $((BUDGET - (SECONDS - T0) - MARGIN)); }
# limit NAME SECONDS: this step's time limit, or 0 (and a note) when the phase's budget is spent
limit() {
  local l; l=$(left)
  if [ "$l" -lt 15 ]; then note "  SKIPPED $1: the phase's ${BUDGET}s budget is spent" >&2; echo 0; return; fi
  if [ "$2" -lt "$l" ]; then echo "$2"; else echo "$l"; fi
}
HAS_CUDA=0 DEV=cpu CPUQ=
on_cpu_note() {  # without CUDA, the steps that can run on CPU do: the plumbing, not the figures
  [ "$HAS_CUDA" = 1 ] || note "  no CUDA here: $1 on CPU (rehearsing the plumbing, not the GPU's figures)"
}
cuda_only() {  # says so when a CUDA-only step cannot run here
  [ "$HAS_CUDA" = 1 ] && return 0
  note "  CUDA-only, skipped: no CUDA device here ($1)"; return 1
}

deps() {
  step "dependencies (package index off)"
  local wheels=${GPU_PASS_WHEELS:-}
  if [ -z "$wheels" ]; then
    for d in .whl shared/gpu-wheels ../shared/gpu-wheels; do
      if ls "$d"/*.whl >/dev/null 2>&1; then wheels=$d; break; fi
    done
  fi
  if [ -n "$wheels" ]; then
    PIP_NO_INDEX=1 PIP_CONFIG_FILE=/dev/null $PY -m pip install -q --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl > "$work/pip.txt" 2>&1
    note "  wheels from $wheels: exit $? ($(ls "$wheels"/*.whl | wc -l) wheels)"
    export PYTHONPATH=$site:$PWD
  else
    note "  no wheels found (.whl/, shared/gpu-wheels, ../shared/gpu-wheels): the image's packages only"
    export PYTHONPATH=$PWD
  fi
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
  } > "$work/env.txt" 2>&1
  grep -E "^(python|torch)|MISSING" "$work/env.txt" | tee -a "$work/summary.txt" "$summary"
  $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && { HAS_CUDA=1; DEV=cuda; }
  if [ "$HAS_CUDA" = 0 ] && [ -z "$QUICK" ]; then  # CPU: the plumbing on the small model, short
    BIG=small; CPUQ=--quick
  fi
}

# the pass is worth nothing if the project cannot start or its tests cannot be collected: check
# first, in seconds, and stop the phase there rather than spend the GPU's minutes on nothing
preflight() {
  step "preflight: the project imports and the suite collects"
  local bad=0
  $PY -c "import ddptui.cli.main, ddptui.recording.kineto, ddptui.cli.serve, ranks.worker, msgspec, ijson" \
    > "$work/preflight.txt" 2>&1 || bad=1
  timeout 120 $PY -m pytest -q --collect-only -p no:cacheprovider tests > "$work/collect.txt" 2>&1 || bad=1
  note "  $(tail -n 1 "$work/collect.txt")"
  if [ "$bad" = 1 ]; then
    note "  PREFLIGHT FAILED: $(grep -m 3 -E "Error|error" "$work/preflight.txt" "$work/collect.txt" | tr '\n' ' ')"
    return 1
  fi
}

headless() {  # name, then ddptui options
  local name=$1; shift
  local t; t=$(limit "headless $name" 60); [ "$t" = 0 ] && return
  step "headless $name (limit ${t}s): $*"
  DDPTUI_SYNC_DEBUG="$work/sync-$name" timeout "$t" "${DDPTUI[@]}" --headless --device $DEV "$@" \
    --json "$work/headless-$name.json" > "$work/headless-$name.txt" 2> "$work/headless-$name.err"
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
  timeout "$t" "${DDPTUI[@]}" verify --device $DEV "$@" --json "$work/verify-$name.json" > "$work/verify-$name.txt" 2>&1
  note "  exit $?"
  grep -E "^(naive|interleaved|ddp|single) |note:" "$work/verify-$name.txt" | head -n 24 >> "$summary"
  pack
}

timed() {  # name, own limit, log file, command...: a step whose last lines go to the summary
  local name=$1 own=$2 log=$3; shift 3
  local t; t=$(limit "$name" "$own"); [ "$t" = 0 ] && return
  step "$name (limit ${t}s)"
  timeout "$t" "$@" > "$work/$log" 2>&1
  note "  exit $? · $(grep -E '^P[0-9]| ratio|side by side| passed| failed| errors? |^now|share of the step' "$work/$log" | tail -n 4 | tr '\n' ' ')"
  pack
}

phase_a() {
  env_report
  preflight || { pack; return 1; }
  local s="naive,interleaved,ddp,single"
  timed "tests marked gpu" 90 tests-gpu.txt $PY -m pytest -q -m gpu -p no:cacheprovider tests
  on_cpu_note "the headless runs"
  headless nccl-small --gpus 1 --model small --strategies $s --steps "$(n 30)"
  headless gloo-small --gpus 1 --ranks 2 --model small --strategies $s --steps "$(n 30)"
  headless nccl-$BIG${CPUQ:+-2} --gpus 1 --model $BIG --strategies $s --steps "$(n 20)"
  headless gloo-$BIG${CPUQ:+-2} --gpus 1 --ranks 2 --model $BIG --strategies naive,interleaved,ddp --steps "$(n 10)"
  [ -n "$QUICK$CPUQ" ] || headless nccl-deep40 --gpus 1 --model deep40 --strategies $s --steps "$(n 10)"
  [ -n "$QUICK$CPUQ" ] || headless gloo-deep40 --gpus 1 --ranks 2 --model deep40 --strategies naive,ddp --steps "$(n 5)"
}

phase_b() {
  env_report
  on_cpu_note "verify, P1 and P7"
  # world 1 on NCCL: verify says communication is not checked and checks compute
  verify nccl --gpus 1 --model $BIG --strategies naive,interleaved,ddp,single --steps 6
  # gloo with CUDA tensors: AllReduce ends are compared with the end of the copy back
  verify gloo --gpus 1 --ranks 2 --model small --strategies naive,interleaved,ddp --steps 6
  timed "P1 on $BIG (1 rank, NCCL)" 120 p1.txt \
    $PY benchmarks/p1_overhead.py --model $BIG --device $DEV --ranks 1 ${QUICK:+--quick} $CPUQ
  timed "P1 host-bound (global batch 16: steps as short as the host's work)" 90 p1-host.txt \
    $PY benchmarks/p1_overhead.py --model $BIG --device $DEV --ranks 1 --host-bound ${QUICK:+--quick} $CPUQ
  timed "P7 hook cost and host share with real CUDA events" 60 p7.txt \
    $PY benchmarks/p7_hook_cost.py --device $DEV ${QUICK:+--quick} $CPUQ
}

phase_c() {
  env_report
  local x=()
  $PY -c "import xdist" 2>/dev/null && [ -z "$QUICK" ] && x=(-n "${GPU_PASS_XDIST:-8}")
  # (the tests marked serial measure 2-core timings: not here)
  timed "whole suite with CUDA visible" 330 tests-all.txt \
    $PY -m pytest -q -x -p no:cacheprovider "${x[@]}" -m "not serial" $SUITE
  if cuda_only "NVML next to nvidia-smi"; then
    timed "NVML next to nvidia-smi" 40 nvml.txt \
      $PY benchmarks/gpu_nvml.py --seconds $NVML_S --out "$work/nvml.csv"
  fi
  on_cpu_note "the event pool's run and the live UI"
  headless pool-$POOL --gpus 1 --model small --strategies naive,ddp --steps $POOL
  local t; t=$(limit "live UI" 70)
  if [ "$t" = 0 ]; then :
  elif command -v tmux >/dev/null 2>&1; then
    step "live UI in tmux (SVG screenshot)"
    mkdir -p "$work/shots"
    tmux new-session -d -s gpupass -x 200 -y 50 -c "$work/shots" \
      "env PYTHONPATH=$PYTHONPATH $PY -m ddptui.cli.main --device $DEV --gpus 1 --ranks 2 --model $BIG --strategies naive,ddp"
    sleep 40; tmux send-keys -t gpupass s; sleep 3
    tmux capture-pane -p -t gpupass > "$work/shots/pane.txt"
    tmux send-keys -t gpupass q; sleep 8
    tmux kill-session -t gpupass 2>/dev/null
    note "  $(ls "$work/shots" | tr '\n' ' ')"
    pack
  else
    note "  no tmux on this machine: no live UI screenshot"
  fi
}

# alone, after everything else: nothing else may share the GPU or the cores while it runs
phase_clock() {
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

deps
case $phase in
  a) phase_a ;;
  b) phase_b ;;
  c) phase_c ;;
  clock) phase_clock ;;
  *) echo "usage: $0 a|b|c|clock [OUTDIR]" >&2; exit 2 ;;
esac
rc=$?
note "phase $phase: $((SECONDS - T0)) s of its ${BUDGET} s"
pack
echo "gpu pass ($phase): $summary, $out/gpu-pass-$phase.tar.gz"
exit $rc
