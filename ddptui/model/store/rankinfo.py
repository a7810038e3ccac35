"""RankInfo: what the Store knows of one rank (its process, device, phase, step, connection),
made by the frame handlers (intake.py) and handed out as copies (queries.py)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RankInfo:
    rank: int
    pid: int | None = None
    device: str = ""
    backend: str = ""
    note: str = ""
    phase: str = "connecting"
    step: int = -1
    connected: bool = False
    last_seen: float = 0.0
    dropped_spans: int = 0
    error: str | None = None
    exit: str | None = None
    finished: bool = False
    uuid: str | None = None  # the GPU's UUID (CUDA ranks)
    clock_res_ns: int | None = None  # CUDA: GPU-timer mapping residual at the last calibration
    clock_bound_ns: int | None = None  # CUDA: how far a span's time may be off (the map's error bound)
    # the oldest collective the rank is inside, as its last heartbeat said: (op, group
    # sequence number, bytes, layer, issued at host ns), or None; and how many it has entered
    # (parameters, gradients, optimizer state held, whole model's parameters) in bytes, as
    # the hello said (a user's model), and the CUDA allocator's peak then
    memory: tuple | None = None
    mem_peak: int | None = None
    waiting: tuple | None = None
    colls_entered: int | None = None
    waiting_bucket: int | None = None  # the DDP bucket `waiting` is the AllReduce of, if one
    # the pipeline send or receive `waiting` is, if one: (direction, peer, stage, microbatch)
    waiting_p2p: tuple | None = None
    hb_ts: int | None = None  # the last heartbeat's time, the rank's host ns (how long it has waited)

    def copy(self) -> "RankInfo":
        """A shallow copy (copy.copy's reduce protocol costs ten times this: the status bar
        and the GPU panel take one per rank every frame)."""
        new = object.__new__(RankInfo)
        new.__dict__.update(self.__dict__)
        return new
