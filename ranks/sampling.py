"""Layer marks on a sample of steps: the period (`every_for`) that keeps ddptui's host time within
its share of a step, the step's length taken on the device it runs on (a GPU step's own time,
not the host's launch time: see `Recorder.end` and `Recorder._resolve`)."""
from __future__ import annotations

from .spec import MAX_LAYER_EVERY


# Layer marks on a sample of steps. A marked layer costs the training thread PyTorch's dispatch
# of a hook and two marks a step; on a step of ~1 ms (a host-bound GPU step) that is several
# per cent. Where a strategy's hooks can be switched off (attach_layer_hooks' LayerMarks), its
# layers are marked on one step in `every` (a power of two, the step number a multiple of
# it: every rank marks the same steps), as few as keep that cost within MARKS_SHARE of the
# step: half of LAYER_SHARE, ddptui's whole host time a step, the other half the steps' own
# marks and bookkeeping, made every step. The other steps mark the forward's and backward's
# start and end (PASS spans), and every collective as always.
LAYER_SHARE = 0.005
# Steps whose layers are not marked (short ones) are handed over by Recorder.poll in fours: a
# poll per step was a tenth of such a step's cost to the training thread (the app is a few ms
# later to see them)
POLL_BATCH = 4
SPARE = 8  # such steps' records kept for reuse once resolved (Recorder._spare)
MARKS_SHARE = LAYER_SHARE / 2
MAX_EVERY = MAX_LAYER_EVERY
# a marked layer of a sampled model: a pre-hook registered in its forward and called in its
# backward (ranks.strategies.LayerMarks; ~4 µs here, where a hook registered once costs
# ~1.1-1.4 µs of PyTorch's call but ~0.5 µs on every step ever after, marked or not). The
# period's first guess: once layers are sampled, what a marked step takes over the others
# (Recorder._marked_ns) is the cost where it is more (P7: ~5-8 µs a layer here, by the minute)
LAYER_HOOK_NS = 4_000


def every_for(cost_ns: float, step_ns: float, cur: int = 1) -> int:
    """The sampling period that keeps `cost_ns` of layer marks a marked step within
    MARKS_SHARE of a step of `step_ns`: a power of two up to MAX_EVERY. It comes down from
    `cur` only when a third of it would do (no flapping at a boundary)."""
    want = cost_ns / (MARKS_SHARE * max(step_ns, 1.0))
    every = 1
    while every < want and every < MAX_EVERY:
        every *= 2
    if every < cur and want > cur / 3:
        every = cur
    return every
