"""Timing of layers, collectives, optimizer and steps, inside each rank: the public face of the
rooms it is built of (import from here, or from the room itself):

- `ranks.core.clocks`    CpuClock, CudaClock (marks; calibration between steps), measure_hook_lag
- `ranks.core.timemap`   GpuTimeMap, CalPoint (GPU timer -> host CLOCK_MONOTONIC)
- `ranks.core.recorder`  Recorder, StepRecord, Pending (slots a step's marks go into, handed over)
- `ranks.core.resolve`   comm_starts, letting_go (marks -> spans, on the sender thread)
- `ranks.core.sampling`  every_for, LAYER_SHARE (layer marks on a sample of steps)

Hot path rule: hooks only take a timestamp (CPU) or record a pooled CUDA event (GPU) into
preallocated slots. Turning slots into spans happens later, off the critical path: on CUDA a
step is resolved only once its last event has completed (no per-step synchronize), on the
sender thread (`poll(lazy=True)`), not the training thread.

Clocks. Every span ends up in ns of the host's CLOCK_MONOTONIC (one axis for all ranks of a
host). On CPU that is what the hooks read. On CUDA the hooks record events; a step's events
are resolved against that step's own start event (short intervals: float32 `elapsed_time`
keeps sub-µs resolution), and the start event is mapped to host time through `GpuTimeMap`.
"""
from __future__ import annotations

from ranks.core.clocks import CpuClock, CudaClock, measure_hook_lag
from ranks.core.recorder import NO_COMMS, Pending, Recorder, StepRecord
from ranks.core.resolve import HANDOFF_NS, YIELD_EVERY, comm_starts, letting_go
from ranks.core.sampling import (LAYER_HOOK_NS, LAYER_SHARE, MARKS_SHARE, MAX_EVERY, POLL_BATCH, SPARE,
                       every_for)
from ranks.core.timemap import CalPoint, GpuTimeMap

__all__ = ["CalPoint", "CpuClock", "CudaClock", "GpuTimeMap", "HANDOFF_NS", "LAYER_HOOK_NS",
           "LAYER_SHARE", "MARKS_SHARE", "MAX_EVERY", "NO_COMMS", "POLL_BATCH", "Pending",
           "Recorder", "SPARE", "StepRecord", "YIELD_EVERY", "comm_starts", "every_for",
           "letting_go", "measure_hook_lag"]
