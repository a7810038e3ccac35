"""Layer marks on a sample of steps: the period (`every_for`) that keeps ddptui's host time within
its share of a step, the step's length taken on the device it runs on (a GPU step's own time,
not the host's launch time: see `Recorder.end` and `Recorder._resolve`)."""
from __future__ import annotations

from ranks.spec import MAX_LAYER_EVERY


# Layer marks on a sample of steps. A marked layer costs the training thread PyTorch's dispatch
# of a hook and two marks a step; on a step of ~1 ms (a host-bound step) that is several per
# cent. Where a strategy's hooks can be switched off (attach_layer_hooks' LayerMarks), its
# layers are marked on one step in `every` (a power of two, the step number a multiple of it:
# every rank marks the same steps), as few as keep that cost within MARKS_SHARE of the step.
# LAYER_SHARE is ddptui's whole host time a step. The step's length is the longer of its host
# time and, on a GPU, its own time on the device (Recorder._resolve): a GPU-bound step whose
# host runs ahead has the GPU's length, and its marks are judged against that, not against the
# host's launch time. On the first H100 (xlarge, 7.7 ms steps) every layer of every step is
# then marked; a host-bound step (tiny layers, ~1 ms) is sampled. The other steps mark the
# forward's and backward's start and end (PASS spans), and every collective as always.
LAYER_SHARE = 0.01
# Steps whose layers are not marked (short ones) are handed over by Recorder.poll in fours: a
# poll per step was a tenth of such a step's cost to the training thread (the app is a few ms
# later to see them)
POLL_BATCH = 4
# the hooks registered once for a strategy whose every step is marked (LayerMarks) wait for this
# many timed steps after its first (a warm-up, not timed): a slow start alone does not leave
# hooks PyTorch calls on every step after (Recorder.begin)
SETTLE = 3
SPARE = 8  # such steps' records kept for reuse once resolved (Recorder._spare)
# the layer marks' part of it: all of it. What a step marks every step besides (its start and
# end, the passes', the collectives': a dozen marks at xlarge) is not sampled away, and with
# the layers' counted too a GPU-bound xlarge step (7.7 ms on the first H100: 8 layers, 2 marks
# and a hook each, 64 µs, 0.83 %) would be sampled 1 step in 2 for a tenth of a per cent
MARKS_SHARE = LAYER_SHARE
MAX_EVERY = MAX_LAYER_EVERY
# a marked layer's hook, the period's first guess where the device's is not measured (a CPU
# run): a pre-hook registered in its forward and called in its backward (ranks.builtin.strategies.
# LayerMarks; ~4 µs on a CPU here, where a hook registered once costs ~1.1-1.4 µs of PyTorch's
# call). On a GPU the clock measures its host's dispatch (CudaClock.hook_lag_ns; 3.2 µs on the
# first H100). Once layers are sampled, what a marked step takes over the others
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
