"""What a run is: the typed description a Store holds as ``meta``.

Built from what is known before any rank speaks (the CLI's settings, a recording's header)
and completed by the ranks' hello frames (rank 0's describes the model; every rank its
device). A run simulated rather than measured (`ddptui demo`) says so in `simulated`, and every
report of it carries `simulated_label`. Readers take attributes (``store.meta.layers``); ``as_dict()`` gives the header's
and the JSON report's map (keys as written in recordings, so files made before stay read
the same). Header keys this class does not name are kept as read, in ``extra``.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any

from ranks import frames

# fields rank 0's hello sets when the run's model is not known yet
_FROM_HELLO = ("world", "model", "layers", "params", "strategies", "batch", "steps",
               "bucket_cap_mb", "seed", "lr", "torch", "backend", "note", "threads")


@dataclass
class RunInfo:
    model: str | None = None
    world: int | None = None  # ranks in the run (None: not known yet)
    layers: list[str] = field(default_factory=list)  # the layer names, by index
    params: list[list] = field(default_factory=list)  # [name, elements, layer index] by parameter
    strategies: list[str] = field(default_factory=list)
    batch: int | None = None  # the global batch
    # how the batch is known: "inputs" (the ranks' rank_batch, summed: a user's model), else
    # given (the CLI, a worker, instrument(batch=)); each rank's own count, by rank as text
    batch_from: str | None = None
    rank_batches: dict[str, int] = field(default_factory=dict)
    steps: int | None = None
    bucket_cap_mb: float | None = None  # DDP's bucket cap at the start
    bucket_cap_mb_now: float | None = None  # the cap as last reported by a rank
    seed: int | None = None
    lr: float | None = None
    torch: str | None = None
    backend: str | None = None
    note: str | None = None
    threads: int | None = None
    host: str | None = None
    device: str | None = None  # the run's device kind ("cpu", "cuda")
    gpus: int | None = None
    devices: dict[str, str] = field(default_factory=dict)  # rank (as text) -> its device
    settings: dict[str, Any] = field(default_factory=dict)  # the CLI's options of a live run
    simulated: dict[str, Any] | None = None  # a simulated run (`ddptui demo`): its profile, basis
    # a pipeline (torch.distributed.pipelining): {"schedule", "stages", "microbatches",
    # "plan_idle": {rank as text: its planned idle share}, "rank_stages": {rank as text: [stage indices]},
    # "rank_layers": {rank as text: its own layer names}: the run's `layers` are positions}
    pipeline: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # header keys not named above

    # -- building ------------------------------------------------------------------------
    def merge(self, meta: dict) -> None:
        """Take a header's or the CLI's values where this has none (None, or empty)."""
        for k, v in copy.deepcopy(meta).items():
            if k in _NAMES:
                if _empty(getattr(self, k)) and v is not None:
                    setattr(self, k, list(v) if k in ("layers", "params", "strategies") and
                            isinstance(v, (list, tuple)) else v)
            else:
                self.extra.setdefault(k, v)

    def take_hello(self, f: frames.Hello, device: str) -> None:
        """What a rank's hello says: the model (the first hello with a parameter table), the
        versions and host where still unknown, and the rank's device."""
        if not self.params:
            for k in _FROM_HELLO:
                v = getattr(f, k)
                setattr(self, k, None if v is frames.UNSET else v)
            self.layers = list(f.layers or [])
            self.params = [list(p) for p in f.params or []]
            self.strategies = list(f.strategies or [])
        for k in ("torch", "backend", "host"):
            v = getattr(f, k)
            if getattr(self, k) is None and v is not frames.UNSET and v is not None:
                setattr(self, k, v)
        self.devices[str(f.rank)] = device
        pipe = getattr(f, "pipe", frames.UNSET)
        if pipe is not frames.UNSET and pipe is not None:
            # a pipeline's ranks hold other blocks, as many or more: its layers are positions
            # ("block 3": each rank's fourth), the run's as many as the rank holding the most;
            # a parameter index past the first hello's table is named by the rank that has it
            more = list(f.layers or [])
            if len(more) > len(self.layers):
                self.layers += more[len(self.layers):]
            rows = [list(p) for p in f.params or []]
            if len(rows) > len(self.params):
                self.params += rows[len(self.params):]
            if self.pipeline is None:
                self.pipeline = {"schedule": pipe.schedule, "stages": pipe.stages,
                                 "microbatches": pipe.microbatches, "plan_idle": {}, "rank_stages": {}}
            self.pipeline["rank_stages"][str(f.rank)] = list(pipe.rank_stages)
            if pipe.plan_idle is not None:
                self.pipeline["plan_idle"][str(f.rank)] = pipe.plan_idle
            if pipe.layers is not frames.UNSET:
                self.pipeline.setdefault("rank_layers", {})[str(f.rank)] = list(pipe.layers)
        if f.rank_batch is not frames.UNSET:
            self.rank_batches[str(f.rank)] = int(f.rank_batch)
        if self.rank_batches and (self.batch_from == "inputs" or not self.batch):
            self._batch_from_inputs()

    def _batch_from_inputs(self) -> None:
        """The global batch as the sum of the ranks' own (until every rank has said, their
        mean times the ranks); unknown (None) while no rank's inputs had a batch dimension."""
        got = [v for v in self.rank_batches.values() if v > 0]
        if not got:
            self.batch, self.batch_from = None, "inputs"
            return
        world = self.world or len(self.rank_batches)
        total = sum(got) if len(self.rank_batches) >= world else round(sum(got) * world / len(got))
        self.batch, self.batch_from = int(total), "inputs"

    # -- reading -------------------------------------------------------------------------
    def as_dict(self) -> dict:
        """The header's / JSON's map: every known field that has a value, then `extra`."""
        out = {}
        for name in _NAMES:
            v = getattr(self, name)
            if v is not None and not (name in _OMIT_EMPTY and not v):
                out[name] = copy.deepcopy(v)
        for k, v in self.extra.items():
            out.setdefault(k, copy.deepcopy(v))
        return out

    def limits(self) -> frames.Limits:
        """What this run's frames are checked against."""
        return frames.Limits(self.world if self.world else None,
                             frozenset(self.strategies) if self.strategies else None,
                             len(self.layers) or None, len(self.params) or None)

    def layer_name(self, i: int) -> str:
        return self.layers[i] if 0 <= i < len(self.layers) else f"layer {i}"


FLIGHT_RECORDER = "flight-recorder"  # the model of a run read from Flight Recorder dumps (a replay, an attach)


def flight_recorder_run(meta) -> bool:
    """Whether the run (a header's map, or a RunInfo) was read from PyTorch's Flight Recorder
    (recording/frdump.py, frstream.py): collectives only, no device samples nor parameters."""
    model = meta.model if isinstance(meta, RunInfo) else (meta or {}).get("model")
    return model == FLIGHT_RECORDER


def simulated_label(meta) -> str | None:
    """'SIMULATED · 4x A100 80GB PCIe · 4 GPUs' for a simulated run's header (a map, or a
    RunInfo), None for a measured run. Any value under `simulated` makes a run simulated."""
    sim = meta.simulated if isinstance(meta, RunInfo) else (meta or {}).get("simulated")
    if sim is None or sim is False:
        return None
    bits = ["SIMULATED"]
    if isinstance(sim, dict):
        if sim.get("name"):
            bits.append(str(sim["name"]))
        if sim.get("gpus"):
            bits.append(f"{sim['gpus']} GPUs")
    return " · ".join(bits)


_NAMES = tuple(f.name for f in fields(RunInfo) if f.name != "extra")
_OMIT_EMPTY = frozenset(("layers", "params", "strategies", "devices", "settings", "rank_batches"))


def _empty(v) -> bool:
    return v is None or (isinstance(v, (list, dict)) and not v)
