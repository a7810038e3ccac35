#!/usr/bin/env bash
# The GPU pass: every CUDA path of ddptui on a real NVIDIA GPU, measured, in two phases that
# each fit a 10-minute command (or `all` in one go). Everything is written under a work folder
# and packed into ONE archive (plus a summary) in the output folder.
#
#   benchmarks/gpu_pass.sh a   [OUTDIR]   tests marked gpu; headless NCCL (world 1) and gloo with
#                                         CUDA tensors (2 ranks on one GPU) on small, xlarge and
#                                         deep40, with the sync probe; verify on both (NCCL at
#                                         world 1: compute only, NCCL launches no kernel for one
#                                         rank; gloo-CUDA: AllReduce ends against the copy back);
#                                         starts the 15-minute clock-residual run in the background
#   benchmarks/gpu_pass.sh b   [OUTDIR]   the whole suite with CUDA visible; P1 on xlarge (and
#                                         host-bound); P7 with real CUDA events; NVML next to
#                                         nvidia-smi; 1,000 steps (event pool); the live UI in
#                                         tmux (SVG); collects the clock run
#   benchmarks/gpu_pass.sh all [OUTDIR]
#
# GPU_PASS_QUICK=1 rehearses the plumbing (small model, 3 steps, short clock/NVML runs, one
# test file instead of the suite) — on a CPU machine too, where the CUDA-only steps say so.
#
# OUTDIR defaults to $OUT (the device tool's folder) or ./gpu-pass. What the machine lacks comes
# as wheels in .whl/ (pure-Python: Textual and its needs, the snapshot plugin); torch, NVML
# bindings, msgpack, psutil, rich and pytest are usually there (env.txt says).
set -uo pipefail
phase=${1:-all}
out=${2:-${OUT:-gpu-pass}}
cd "$(dirname "$0")/.."
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=/tmp/ddptui-gpu-pass
mkdir -p "$work"
export OMP_NUM_THREADS=4 PYTHONUNBUFFERED=1 DDPTUI_RUNS_DIR="$work/runs"
PY=${GPU_PASS_PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
DDPTUI=($PY -m ddptui.cli.main)
QUICK=${GPU_PASS_QUICK:-}
BIG=xlarge; CLOCK_S=900; NVML_S=20; POOL=1000; SUITE=tests
if [ -n "$QUICK" ]; then BIG=small; CLOCK_S=10; NVML_S=3; POOL=20; SUITE=tests/test_pipeline.py; fi
n() { if [ -n "$QUICK" ]; then echo 3; else echo "$1"; fi; }  # steps

step() { echo "== $(date +%T) $*" | tee -a "$work/summary.txt"; }
note() { echo "$*" | tee -a "$work/summary.txt"; }

env_report() {
  step "environment"
  { nvidia-smi; $PY - <<'EOF'
import importlib
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
for m in ("textual", "rich", "msgpack", "psutil", "pynvml", "pytest", "hypothesis", "syrupy", "textual_serve"):
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, "__version__", "present"))
    except Exception as e:  # noqa: BLE001
        print(m, "MISSING", type(e).__name__)
EOF
  } > "$work/env.txt" 2>&1
  grep -E "^torch|MISSING" "$work/env.txt" | tee -a "$work/summary.txt"
}

headless() {  # name, then ddptui options
  local name=$1; shift
  step "headless $name: $*"
  DDPTUI_SYNC_DEBUG="$work/sync-$name" timeout 300 "${DDPTUI[@]}" --headless "$@" \
    --json "$work/headless-$name.json" > "$work/headless-$name.txt" 2> "$work/headless-$name.err"
  note "  exit $? · $(tail -n 3 "$work/headless-$name.txt" | tr '\n' ' ')"
  $PY - "$work/sync-$name" <<'EOF' | tee -a "$work/summary.txt"
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/rank*.json")):
    d = json.load(open(f))
    print(f"  sync probe rank {d['rank']}: {d['measured_steps']} measured steps, "
          f"{sum(v['count'] for v in d['syncs'].values())} synchronizes inside them; "
          f"CUDA events allocated {d['events_allocated']}, pooled {d['events_pooled']}")
    for k, v in list(d["syncs"].items())[:5]:
        print(f"    {v['count']}x {k}")
EOF
}

verify() {
  local name=$1; shift
  step "verify $name: $*"
  timeout 300 "${DDPTUI[@]}" verify "$@" --json "$work/verify-$name.json" > "$work/verify-$name.txt" 2>&1
  note "  exit $?"
  grep -E "^(naive|interleaved|ddp|single) " "$work/verify-$name.txt" >> "$work/summary.txt"
}

phase_a() {
  env_report
  step "clock residual run (background, $CLOCK_S s)"
  setsid nohup $PY benchmarks/gpu_clock.py --seconds $CLOCK_S --out "$work/clock.csv" \
    > "$work/clock.log" 2>&1 < /dev/null &
  step "tests marked gpu"
  timeout 400 $PY -m pytest -q -m gpu -p no:cacheprovider tests > "$work/tests-gpu.txt" 2>&1
  note "  $(tail -n 1 "$work/tests-gpu.txt")"
  local s="naive,interleaved,ddp,single"
  headless nccl-small --gpus 1 --model small --strategies $s --steps "$(n 30)"
  headless gloo-small --gpus 1 --ranks 2 --model small --strategies $s --steps "$(n 30)"
  headless nccl-$BIG --gpus 1 --model $BIG --strategies $s --steps "$(n 20)"
  headless gloo-$BIG --gpus 1 --ranks 2 --model $BIG --strategies naive,interleaved,ddp --steps "$(n 10)"
  [ -n "$QUICK" ] || headless nccl-deep40 --gpus 1 --model deep40 --strategies $s --steps 10
  [ -n "$QUICK" ] || headless gloo-deep40 --gpus 1 --ranks 2 --model deep40 --strategies naive,ddp --steps 5
  # world 1 on NCCL: verify says communication is not checked and checks compute
  verify nccl --gpus 1 --model $BIG --strategies naive,interleaved,ddp,single --steps 6
  # gloo with CUDA tensors: AllReduce ends are compared with the end of the copy back
  verify gloo --gpus 1 --ranks 2 --model small --strategies naive,interleaved,ddp --steps 6
  grep -E "note:" "$work/verify-nccl.txt" "$work/verify-gloo.txt" | head -n 6 >> "$work/summary.txt"
}

phase_b() {
  [ -f "$work/env.txt" ] || env_report
  step "whole suite with CUDA visible"
  timeout 420 $PY -m pytest -q -x -p no:cacheprovider $SUITE > "$work/tests-all.txt" 2>&1
  note "  $(tail -n 1 "$work/tests-all.txt")"
  step "P1 on $BIG (1 rank, NCCL)"
  timeout 300 $PY benchmarks/p1_overhead.py --model $BIG --device cuda --ranks 1 ${QUICK:+--quick} > "$work/p1.txt" 2>&1
  note "  $(grep -E '^P1|ratio' "$work/p1.txt" | tail -n 3 | tr '\n' ' ')"
  step "P1 host-bound (global batch 16: steps as short as the host's work)"
  timeout 300 $PY benchmarks/p1_overhead.py --model $BIG --device cuda --ranks 1 --host-bound ${QUICK:+--quick} > "$work/p1-host.txt" 2>&1
  note "  $(grep -E '^P1|side by side' "$work/p1-host.txt" | tail -n 2 | tr '\n' ' ')"
  step "P7 hook cost with real CUDA events"
  timeout 200 $PY benchmarks/p7_hook_cost.py --device cuda ${QUICK:+--quick} > "$work/p7.txt" 2>&1
  note "  $(grep -E '^P7|now' "$work/p7.txt" | tail -n 3 | tr '\n' ' ')"
  step "NVML next to nvidia-smi"
  timeout 120 $PY benchmarks/gpu_nvml.py --seconds $NVML_S --out "$work/nvml.csv" > "$work/nvml.txt" 2>&1
  note "  $(tail -n 1 "$work/nvml.txt")"
  headless pool-$POOL --gpus 1 --model small --strategies naive,ddp --steps $POOL
  if command -v tmux >/dev/null 2>&1; then
    step "live UI in tmux (SVG screenshot)"
    mkdir -p "$work/shots"
    tmux new-session -d -s gpupass -x 200 -y 50 -c "$work/shots" \
      "env PYTHONPATH=$PYTHONPATH $PY -m ddptui.cli.main --gpus 1 --ranks 2 --model $BIG --strategies naive,ddp"
    sleep 40; tmux send-keys -t gpupass s; sleep 3
    tmux capture-pane -p -t gpupass > "$work/shots/pane.txt"
    tmux send-keys -t gpupass q; sleep 8
    tmux kill-session -t gpupass 2>/dev/null
    note "  $(ls "$work/shots" | tr '\n' ' ')"
  else
    note "  no tmux on this machine: no live UI screenshot"
  fi
  if [ -f "$work/clock.csv" ]; then
    note "clock: $(tail -n 1 "$work/clock.log")"
  else
    note "clock: still running or not started ($(tail -n 1 "$work/clock.log" 2>/dev/null))"
  fi
}

case $phase in
  a) phase_a ;;
  b) phase_b ;;
  all) phase_a; phase_b ;;
  *) echo "usage: $0 a|b|all [OUTDIR]" >&2; exit 2 ;;
esac
cp "$work/summary.txt" "$out/summary-$phase.txt"
tar czf "$out/gpu-pass-$phase.tar.gz" -C "$work" --exclude=runs . 2>/dev/null
echo "gpu pass ($phase): $out/summary-$phase.txt, $out/gpu-pass-$phase.tar.gz"
