#!/usr/bin/env bash
# The torch matrix: ddptui's torch-facing tests under each torch release given, one at a time,
# each in a fresh virtualenv (no system site-packages: what a new user's `pip install` gets).
#
#   benchmarks/torch_matrix.sh                    # 2.11.0 2.13.0 2.15.0
#   benchmarks/torch_matrix.sh 2.13.0 2.15.0
#   TORCH_MATRIX_TESTS="tests/test_verify.py" benchmarks/torch_matrix.sh 2.11.0
#
# For each VERSION: a venv under a temp dir, `pip install torch==VERSION`, then
# `pip install -e '.[test]'` (torch held at VERSION), then pytest on the torch-facing modules:
# instrumentation (test_instrument), user scripts under `ddptui run` / `--auto` (test_user_run;
# test_user_scripts: the patterns of real training scripts), `ddptui verify` against
# torch.profiler (test_verify), the Kineto import (test_kineto_import) and the CUDA code paths
# (test_cuda_path; without a GPU its simulated parts run, the rest skips). Prints a table
# VERSION -> torch build, passed/failed/skipped/errors, install and test seconds; exits 1 if
# any version failed a test or did not install.
#
# Disk and time: on PyPI most releases are CUDA builds that pull ~3 GB of nvidia-* wheels (they
# run fine on a CPU; such a venv is 4.7 to 5.4 GB, 1.5 to 3 min to install); a CPU build of
# 2.13.0 lies in this machine's wheel folder (0.95 GB). Each venv is deleted after its run
# (TORCH_MATRIX_KEEP=1 keeps them), and pip's cache is off (3 GB a version otherwise). Logs
# stay in TORCH_MATRIX_LOGS (default: a temp dir, printed at the end).
# This machine's pip config caps torch (/etc/xdg/pip/constraints.txt); the script lifts that cap
# for its own venvs only (PIP_CONSTRAINT=/dev/null), not for .venv. The editable install leaves
# ddptui.egg-info in the tree (git ignores it).
#
# Environment: PYTHON (the interpreter the venvs are made from; default python3),
# TORCH_MATRIX_TESTS (pytest arguments instead of the modules above), TORCH_MATRIX_WORKERS
# (pytest-xdist workers, default 2), TORCH_MATRIX_KEEP, TORCH_MATRIX_LOGS.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
versions=("$@")
[ "${#versions[@]}" -gt 0 ] || versions=(2.11.0 2.13.0 2.15.0)
read -r -a tests <<<"${TORCH_MATRIX_TESTS:-tests/test_instrument.py tests/test_user_run.py tests/test_user_scripts.py tests/test_verify.py tests/test_kineto_import.py tests/test_cuda_path.py}"
workers=${TORCH_MATRIX_WORKERS:-2}
logs=${TORCH_MATRIX_LOGS:-$(mktemp -d -t ddptui-torch-matrix-logs.XXXXXX)}
mkdir -p "$logs"
export PIP_CONSTRAINT=/dev/null PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export OMP_NUM_THREADS=1  # as CI runs the suite
unset PYTHONDONTWRITEBYTECODE

rows=()
status=0
for v in "${versions[@]}"; do
  work=$(mktemp -d -t ddptui-torch-$v.XXXXXX)
  venv=$work/venv
  log=$logs/torch-$v.log
  echo "== torch $v: venv in $venv, log $log" >&2
  t0=$(date +%s)
  ok=1
  { "$PY" -m venv "$venv" &&
    "$venv/bin/python" -m pip install -q "torch==$v" &&
    "$venv/bin/python" -m pip install -q -e ".[test]" "torch==$v"; } >"$log" 2>&1 || ok=
  t1=$(date +%s)
  if [ -z "$ok" ]; then
    echo "   install failed (see $log)" >&2
    rows+=("$v|-|install failed|-|-|-|$((t1 - t0))|-|-")
    status=1
  else
    build=$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>>"$log" || echo '?')
    nv=$(ls "$venv"/lib/python*/site-packages | grep -v '^nvidia_ml_py' | grep -c '^nvidia_.*dist-info$' || true)
    size=$(du -sh "$venv" 2>/dev/null | cut -f1)
    echo "   torch $build ($nv nvidia-* wheels, venv $size), installed in $((t1 - t0)) s; testing" >&2
    xdist=()
    [ "$workers" -gt 0 ] && xdist=(-n "$workers" --dist loadgroup)
    "$venv/bin/python" -m pytest -q -p no:cacheprovider -rfEs "${xdist[@]}" "${tests[@]}" \
      >>"$log" 2>&1
    rc=$?
    t2=$(date +%s)
    # pytest's closing line (-q): "3 failed, 40 passed, 2 skipped, 2 warnings in 80.1s"
    last=$(grep -E '[0-9]+ (passed|failed|skipped|errors?|deselected).* in [0-9.]+s' "$log" | tail -1)
    count() { echo "$last" | grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' || echo 0; }
    p=$(count passed); f=$(count failed); s=$(count skipped); e=$(count 'errors?')
    if [ "$rc" -ne 0 ] || [ "$f" -ne 0 ] || [ "$e" -ne 0 ] || [ "$p" -eq 0 ]; then
      status=1
      grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/   /' >&2
    fi
    rows+=("$v|$build|$([ "$rc" -eq 0 ] && echo ok || echo "FAIL rc=$rc")|$p|$f|$s|$((t1 - t0))|$((t2 - t1))|$e")
  fi
  if [ -z "${TORCH_MATRIX_KEEP:-}" ]; then rm -rf "$work"; else echo "   kept $venv" >&2; fi
done

printf '\n%-9s %-14s %-12s %7s %7s %8s %7s %10s %8s\n' torch build result passed failed skipped errors install_s tests_s
for r in "${rows[@]}"; do
  IFS='|' read -r v b res p f s ti tt e <<<"$r"
  printf '%-9s %-14s %-12s %7s %7s %8s %7s %10s %8s\n' "$v" "$b" "$res" "$p" "$f" "$s" "$e" "$ti" "$tt"
done
echo "logs: $logs"
exit "$status"
