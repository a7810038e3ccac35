"""The host clock every rank-side timestamp is taken from: CLOCK_MONOTONIC in ns.

Test seam: ``DDPTUI_CLOCK_SKEW_NS`` (read once, at import) adds a fixed skew to every reading,
so that two "hosts" on one machine have different clocks (tests of the multi-node clock
correction). Without it `now_ns` *is* ``time.monotonic_ns``: the hot path pays nothing.
"""
from __future__ import annotations

import os
import time


def _skew() -> int:
    try:
        return int(os.environ.get("DDPTUI_CLOCK_SKEW_NS", "0") or 0)
    except ValueError:
        return 0


SKEW_NS = _skew()

if SKEW_NS:
    _mono = time.monotonic_ns

    def now_ns() -> int:
        return _mono() + SKEW_NS
else:
    now_ns = time.monotonic_ns
