#!/usr/bin/env bash
# A replica of the GPU machine on a CPU machine, to rehearse benchmarks/gpu_pass.sh before a GPU
# is lent, so that the GPU's minutes go to the GPU.
#
#   benchmarks/gpu_replica.sh [PHASES] [OUTDIR]     PHASES: comma-separated, default a,b
#
# What the GPU machine is (see the device tool's notes): Python 3.12 with an image of packages
# (torch 2.11 and, of those the project uses, numpy, msgpack, psutil, nvidia-ml-py, pytest,
# pytest-xdist, pytest-timeout, hypothesis, aiohttp, jinja2, rich), no package index, and the
# checkout as the device tool sends it (tracked and untracked-not-ignored files, plus what the
# caller carries: the wheels of ../shared/gpu-wheels in .whl/). The replica builds the same:
#
# 1. the image: a virtual environment of $PYTHON (default: python3.12 on PATH; it must be 3.12)
#    with torch 2.11 (GPU_REPLICA_TORCH; a CUDA build runs on CPU too) and the packages above,
#    from the package index: this is the image, built once and kept in GPU_REPLICA_DIR;
# 2. the machine: a fresh copy of the checkout as the device tool sends it, the wheels in .whl/;
# 3. each phase of gpu_pass.sh in it with the package index off (PIP_NO_INDEX, no pip config):
#    whatever the image lacks comes only from the wheels, as on the GPU machine. Each phase
#    runs under the device tool's 10-minute limit and is reported against gpu_pass.sh's 8-minute
#    budget. Without CUDA, the CUDA-only steps say so and are skipped.
#
# Environment: PYTHON, GPU_REPLICA_DIR (default ${TMPDIR:-/tmp}/ddptui-gpu-replica: ~5 GB with
# torch's CUDA wheels), GPU_REPLICA_WHEELS (default ../shared/gpu-wheels, else shared/gpu-wheels),
# GPU_REPLICA_TORCH (default "torch==2.11.*"), GPU_PASS_QUICK=1 (gpu_pass.sh's short rehearsal),
# GPU_REPLICA_NO_WHEELS=1 (carry none: what the image alone runs), GPU_REPLICA_PASS_REV=REV (run
# gpu_pass.sh as it was at git revision REV: to see what the replica would have caught).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
phases=${1:-a,b}
dir=${GPU_REPLICA_DIR:-${TMPDIR:-/tmp}/ddptui-gpu-replica}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
out=${2:-$dir/out}
PYTHON=${PYTHON:-python3.12}
TORCH=${GPU_REPLICA_TORCH:-torch==2.11.*}
IMAGE=(numpy msgpack psutil nvidia-ml-py pytest pytest-xdist pytest-timeout hypothesis aiohttp jinja2 rich)
wheels=${GPU_REPLICA_WHEELS:-}
if [ -z "$wheels" ]; then
  for d in "$root/../shared/gpu-wheels" "$root/shared/gpu-wheels"; do
    if ls "$d"/*.whl >/dev/null 2>&1; then wheels=$d; break; fi
  done
fi
[ -n "$wheels" ] || [ -n "${GPU_REPLICA_NO_WHEELS:-}" ] || { echo "gpu_replica: no wheels (GPU_REPLICA_WHEELS, ../shared/gpu-wheels)" >&2; exit 2; }
say() { echo "[replica $(date +%T)] $*"; }

# 1. the image
py=$dir/venv/bin/python
want=$(echo "$TORCH" | sed 's/^torch==//; s/\*$//')
if ! "$py" -c "import sys, torch; sys.exit(0 if torch.__version__.startswith('$want') else 1)" 2>/dev/null; then
  command -v "$PYTHON" >/dev/null || { echo "gpu_replica: $PYTHON not found (set PYTHON=)" >&2; exit 2; }
  "$PYTHON" -c "import sys; sys.exit(0 if sys.version_info[:2] == (3, 12) else 1)" \
    || { echo "gpu_replica: $PYTHON is not Python 3.12" >&2; exit 2; }
  say "building the image: a Python 3.12 venv with $TORCH ${IMAGE[*]} (from the package index)"
  rm -rf "$dir/venv"
  "$PYTHON" -m venv "$dir/venv"
  "$py" -m pip install -q "$TORCH" "${IMAGE[@]}"
else
  missing=$("$py" -c 'import sys, importlib.metadata as m
def has(n):
    try:
        return bool(m.version(n))
    except m.PackageNotFoundError:
        return False
print(" ".join(n for n in sys.argv[1:] if not has(n)))' "${IMAGE[@]}")
  if [ -n "$missing" ]; then
    say "completing the image: $missing"
    "$py" -m pip install -q $missing
  fi
fi
"$py" -m pip list --format=freeze > "$dir/image.txt" 2>/dev/null
say "image: $("$py" -c 'import platform, torch; print("Python", platform.python_version(), "torch", torch.__version__)'), $(wc -l < "$dir/image.txt") packages"

# 2. the machine's checkout: what the device tool sends, and the wheels carried in .whl/
rm -rf "$dir/checkout" "$dir/work" "$dir/site"
mkdir -p "$dir/checkout/.whl"
(cd "$root" && git ls-files -z -co --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$dir/checkout"
[ -n "${GPU_REPLICA_NO_WHEELS:-}" ] || cp "$wheels"/*.whl "$dir/checkout/.whl/"
if [ -n "${GPU_REPLICA_PASS_REV:-}" ]; then
  git -C "$root" show "$GPU_REPLICA_PASS_REV:benchmarks/gpu_pass.sh" > "$dir/checkout/benchmarks/gpu_pass.sh"
  say "gpu_pass.sh as at $GPU_REPLICA_PASS_REV"
fi
say "checkout: $(cd "$dir/checkout" && find . -type f | wc -l) files; $(ls "$dir/checkout/.whl" | wc -l) wheels in .whl/"

# 3. the phases, the package index off
mkdir -p "$out"
rc=0
for p in ${phases//,/ }; do
  say "phase $p"
  t0=$SECONDS
  set +e
  (cd "$dir/checkout" && env PIP_NO_INDEX=1 PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= \
      GPU_PASS_PYTHON="$py" GPU_PASS_WORK="$dir/work" GPU_PASS_SITE="$dir/site" \
      GPU_PASS_XDIST="${GPU_PASS_XDIST:-2}" \
      timeout 600 bash benchmarks/gpu_pass.sh "$p" "$out")
  prc=$?
  set -e
  dt=$((SECONDS - t0))
  verdict="within 8 minutes"
  [ "$dt" -gt 480 ] && { verdict="OVER 8 minutes"; rc=1; }
  [ "$prc" = 124 ] && { verdict="KILLED at the 10-minute limit"; rc=1; }
  [ "$prc" != 0 ] && [ "$prc" != 124 ] && rc=1
  say "phase $p: exit $prc, $dt s ($verdict)" | tee -a "$out/replica.txt"
done
say "results: $out (summary-PHASE.txt, gpu-pass-PHASE.tar.gz, replica.txt)"
exit $rc
