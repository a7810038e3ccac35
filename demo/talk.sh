#!/usr/bin/env bash
# Replay a recording for a talk: full-screen timeline UI, a title, looping until you quit
# (q). Needs no GPU and no torch run: the recording carries everything.
#
#   demo/talk.sh [RECORDING] [TITLE]
#   DDPTUI_TALK_SPEED=2 demo/talk.sh runs/20250101-120000-xlarge-8r.ddptui "8x H100: naive vs DDP"
#
# Defaults: the CPU recording shipped in demo/, at normal speed (0.25..8).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
rec="${1:-$here/cpu-small-2ranks.ddptui}"
title="${2:-Naive data parallelism vs PyTorch DDP}"
speed="${DDPTUI_TALK_SPEED:-1}"

if [ -x "$here/../.venv/bin/ddptui" ]; then
  ddptui="$here/../.venv/bin/ddptui"
elif command -v ddptui >/dev/null 2>&1; then
  ddptui="ddptui"
else
  ddptui="$here/../bin/ddptui"  # sets the checkout up on first use
fi

exec "$ddptui" replay "$rec" --loop --speed "$speed" --title "$title"
