#!/usr/bin/env bash
# A replica of the GPU machine on a CPU machine, to rehearse benchmarks/gpu_pass.sh before a GPU
# is lent, so that the GPU's minutes go to the GPU.
#
#   benchmarks/gpu_replica.sh [PHASES] [OUTDIR]     PHASES: comma-separated pass,suite,clock
#                                                   (default pass,suite)
#
# What the GPU machine is: a Python whose `python3` is itself a virtual environment (an image)
# holding torch and, of what the project uses, numpy, msgpack, psutil, nvidia-ml-py, pytest,
# pytest-xdist, pytest-timeout, hypothesis, aiohttp, jinja2, rich; no package index; the
# checkout as the device tool sends it (tracked and untracked-not-ignored files, plus what the
# caller carries: the wheels the image lacks, in .whl/). The replica builds the same:
#
# 1. the image: a virtual environment of $PYTHON (default python3) with GPU_REPLICA_TORCH
#    (default torch==2.13.*, the CPU build; the first H100 pass's image had torch 2.11+cu130 on
#    Python 3.12) and the packages above, from the package index: built once, kept in
#    GPU_REPLICA_DIR;
# 2. the wheels: GPU_REPLICA_WHEELS (the ones shipped for the GPU machine), those built for
#    another Python (the GPU machine's msgspec and ijson are CPython 3.12's) replaced by the
#    image Python's builds of the same versions, fetched while building the image;
# 3. the machine: a fresh copy of the checkout as the device tool sends it (GPU_REPLICA_REV:
#    the tree at that git revision instead, e.g. to see a failure before its fix), the wheels
#    in .whl/;
# 4. each phase of gpu_pass.sh there, the package index off (PIP_NO_INDEX, no pip config,
#    no find-links), DDPTUI_WHEELS=.whl and GPU_PASS_PYTHON the image's python, as on the GPU
#    machine: whatever the image lacks comes only from the wheels. The suite phase runs with
#    DDPTUI_GPU_COUNT=1 (GPU_REPLICA_GPU_COUNT): the one GPU of that machine, as the launcher
#    counts it, so a test that means CPU and does not say so fails here as it did there.
#    Each phase runs under a time limit (pass, clock: the device tool's 600 s; suite: 900 s on
#    two cores, where the GPU machine's 16 take under 300 s) and is reported against its budget.
#
# Environment: PYTHON, GPU_REPLICA_DIR (default ${TMPDIR:-/tmp}/ddptui-gpu-replica),
# GPU_REPLICA_WHEELS (default ../shared/gpu-wheels, else shared/gpu-wheels), GPU_REPLICA_TORCH,
# GPU_REPLICA_REV, GPU_REPLICA_GPU_COUNT, GPU_PASS_QUICK=1 (gpu_pass.sh's short rehearsal),
# GPU_PASS_SUITE_MODE=target (the suite as the first H100 pass ran it: the wheels installed by
# `pip --target` and PYTHONPATH, no venv), GPU_PASS_SUITE="tests/test_x.py ..." (those files
# instead of the whole suite), GPU_REPLICA_PASS_REV=REV (gpu_pass.sh as it was at REV).
#
# The first H100 pass's suite failures, reproduced (the tree before the fix, the suite as that
# pass ran it; two of the files where both failures showed):
#   GPU_REPLICA_REV=69205d5 GPU_PASS_SUITE_MODE=target \
#     GPU_PASS_SUITE="tests/test_demo_readme.py tests/test_pipeline.py" benchmarks/gpu_replica.sh suite
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
phases=${1:-pass,suite}
dir=${GPU_REPLICA_DIR:-${TMPDIR:-/tmp}/ddptui-gpu-replica}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
out=${2:-$dir/out}
PYTHON=${PYTHON:-python3}
TORCH=${GPU_REPLICA_TORCH:-torch==2.13.*}
IMAGE=(numpy msgpack psutil nvidia-ml-py pytest pytest-xdist pytest-timeout hypothesis aiohttp jinja2 rich)
wheels=${GPU_REPLICA_WHEELS:-}
if [ -z "$wheels" ]; then
  for d in "$root/../shared/gpu-wheels" "$root/shared/gpu-wheels"; do
    if ls "$d"/*.whl >/dev/null 2>&1; then wheels=$d; break; fi
  done
fi
[ -n "$wheels" ] || { echo "gpu_replica: no wheels (GPU_REPLICA_WHEELS, ../shared/gpu-wheels)" >&2; exit 2; }
say() { echo "[replica $(date +%T)] $*"; }

# 1. the image
py=$dir/venv/bin/python
want=$(echo "$TORCH" | sed 's/^torch==//; s/\*$//')
if ! "$py" -c "import sys, torch; sys.exit(0 if torch.__version__.startswith('$want') else 1)" 2>/dev/null; then
  command -v "$PYTHON" >/dev/null || { echo "gpu_replica: $PYTHON not found (set PYTHON=)" >&2; exit 2; }
  say "building the image: a venv of $("$PYTHON" -c 'import platform; print("Python", platform.python_version())') with $TORCH ${IMAGE[*]} (from the package index)"
  rm -rf "$dir/venv" "$dir/wheels"
  "$PYTHON" -m venv "$dir/venv"
  "$py" -m pip install -q "$TORCH" "${IMAGE[@]}"
fi
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
"$py" -m pip list --format=freeze > "$dir/image.txt" 2>/dev/null
say "image: $("$py" -c 'import platform, sys, torch; print("Python", platform.python_version(), "torch", torch.__version__, "(a venv)" if sys.prefix != sys.base_prefix else "")'), $(wc -l < "$dir/image.txt") packages"

# 2. the wheels, with this Python's builds of those made for another
if [ ! -d "$dir/wheels" ]; then
  mkdir -p "$dir/wheels.new"
  cp "$wheels"/*.whl "$dir/wheels.new/"
  tag=$("$py" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  for w in "$dir/wheels.new"/*.whl; do
    b=$(basename "$w")
    case "$b" in *-py3-none-any.whl|*-py2.py3-none-any.whl|*-$tag-*) continue ;; esac
    name=$(echo "$b" | cut -d- -f1); ver=$(echo "$b" | cut -d- -f2)
    say "wheels: $b is not for $tag: $name==$ver's build for it instead (from the package index)"
    "$py" -m pip download -q --no-deps --only-binary=:all: -d "$dir/wheels.new" "$name==$ver"
    rm "$w"
  done
  mv "$dir/wheels.new" "$dir/wheels"
fi

# 3. the machine's checkout: what the device tool sends, and the wheels carried in .whl/
rm -rf "$dir/checkout" "$dir/work" "$dir/site"
mkdir -p "$dir/checkout"
if [ -n "${GPU_REPLICA_REV:-}" ]; then
  git -C "$root" archive "$GPU_REPLICA_REV" | tar -xf - -C "$dir/checkout"
  say "checkout: the tree at $GPU_REPLICA_REV; gpu_pass.sh of this one"
  cp "$root/benchmarks/gpu_pass.sh" "$dir/checkout/benchmarks/gpu_pass.sh"
else
  (cd "$root" && git ls-files -z -co --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$dir/checkout"
fi
mkdir -p "$dir/checkout/.whl"
cp "$dir/wheels"/*.whl "$dir/checkout/.whl/"
if [ -n "${GPU_REPLICA_PASS_REV:-}" ]; then
  git -C "$root" show "$GPU_REPLICA_PASS_REV:benchmarks/gpu_pass.sh" > "$dir/checkout/benchmarks/gpu_pass.sh"
  say "gpu_pass.sh as at $GPU_REPLICA_PASS_REV"
fi
say "checkout: $(cd "$dir/checkout" && find . -type f | wc -l) files; $(ls "$dir/checkout/.whl" | wc -l) wheels in .whl/"

# 4. the phases, the package index off
mkdir -p "$out"
rc=0
for p in ${phases//,/ }; do
  lim=600 budget=480 gpus=
  [ "$p" = suite ] && { lim=900; budget=300; gpus=${GPU_REPLICA_GPU_COUNT:-1}; }
  say "phase $p${gpus:+ (DDPTUI_GPU_COUNT=$gpus)}"
  t0=$SECONDS
  set +e
  (cd "$dir/checkout" && env PIP_NO_INDEX=1 PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= \
      ${gpus:+DDPTUI_GPU_COUNT=$gpus} GPU_PASS_PYTHON="$py" DDPTUI_WHEELS="$dir/checkout/.whl" \
      GPU_PASS_WORK="$dir/work" GPU_PASS_SITE="$dir/site" GPU_PASS_XDIST="${GPU_PASS_XDIST:-3}" \
      GPU_PASS_SUITE_BUDGET_S="$((lim - 30))" \
      timeout "$lim" bash benchmarks/gpu_pass.sh "$p" "$out")
  prc=$?
  set -e
  dt=$((SECONDS - t0))
  verdict="within its ${budget} s on the GPU machine"
  [ "$dt" -gt "$budget" ] && verdict="over the GPU machine's ${budget} s (a 2-core replica)"
  [ "$prc" = 124 ] && { verdict="KILLED at the ${lim} s limit"; rc=1; }
  [ "$prc" != 0 ] && [ "$prc" != 124 ] && rc=1
  say "phase $p: exit $prc, $dt s ($verdict)" | tee -a "$out/replica.txt"
done
say "results: $out (summary-PHASE.txt, gpu-pass-PHASE.tar.gz, replica.txt)"
exit $rc
