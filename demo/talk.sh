#!/usr/bin/env bash
# Replay a recording for a talk: full-screen timeline UI, a title, looping until you quit
# (q). Needs no GPU and no torch run: the recording carries everything.
#
#   demo/talk.sh [RECORDING] [TITLE]
#   DDPTUI_TALK_SPEED=2 demo/talk.sh runs/20250101-120000-xlarge-8r.ddptui "8x H100: naive vs DDP"
#
# Without RECORDING: a GPU recording in demo/ when there is one (any demo/*.ddptui not named
# cpu-* or simulated-*; of those, the one whose name says the most ranks, "2ranks"), else the SIMULATED A100 run (demo/simulated-a100-pcie-xlarge-4gpus.ddptui:
# its title bar says SIMULATED), else the CPU one; at normal speed (0.25..8).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
pick() {
  local f n best= most=-1
  for f in "$here"/*.ddptui; do  # the GPU recording of the most ranks (the name's "<N>ranks")
    case "$(basename "$f")" in cpu-*|simulated-*) continue ;; esac
    [ -f "$f" ] || continue
    n=$(basename "$f" | sed -n 's/.*[^0-9]\([0-9][0-9]*\)ranks\{0,1\}[^0-9].*/\1/p')
    if [ "${n:-0}" -gt "$most" ]; then most=${n:-0}; best=$f; fi
  done
  [ -n "$best" ] && { echo "$best"; return; }
  for f in "$here/simulated-a100-pcie-xlarge-4gpus.ddptui" "$here/cpu-small-2ranks.ddptui"; do
    [ -f "$f" ] && { echo "$f"; return; }
  done
  echo "$here/cpu-small-2ranks.ddptui"
}
rec="${1:-$(pick)}"
title="${2:-Naive data parallelism vs PyTorch DDP}"
speed="${DDPTUI_TALK_SPEED:-1}"

if [ -x "$here/../.venv/bin/ddptui" ]; then
  ddptui="$here/../.venv/bin/ddptui"
elif command -v ddptui >/dev/null 2>&1; then
  ddptui="ddptui"
else
  ddptui="$here/../bin/ddptui"  # sets the checkout up on first use
fi

if [ "${DDPTUI_TALK_DRY_RUN:-}" = 1 ]; then  # (tests: what would play)
  echo "$rec"
  exit 0
fi
exec "$ddptui" replay "$rec" --loop --speed "$speed" --title "$title"
