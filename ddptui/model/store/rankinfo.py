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

    def copy(self) -> "RankInfo":
        """A shallow copy (copy.copy's reduce protocol costs ten times this: the status bar
        and the GPU panel take one per rank every frame)."""
        new = object.__new__(RankInfo)
        new.__dict__.update(self.__dict__)
        return new
