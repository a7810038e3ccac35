"""The host clock every rank-side timestamp is taken from: CLOCK_MONOTONIC in ns.

Test seam: ``DDPTUI_CLOCK_SKEW_NS`` (ranks.seams; read once, at import) adds a fixed skew to
every reading, so that two "hosts" on one machine have different clocks (tests of the
multi-node clock correction). Without it `now_ns` *is* ``time.monotonic_ns``: the hot path
pays nothing.
"""
from __future__ import annotations

import time

from . import seams

SKEW_NS = seams.clock_skew_ns()

if SKEW_NS:
    _mono = time.monotonic_ns

    def now_ns() -> int:
        return _mono() + SKEW_NS
else:
    now_ns = time.monotonic_ns
