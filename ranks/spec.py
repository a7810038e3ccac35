"""Model and strategy names shared by the app and the workers (no torch import)."""
from __future__ import annotations

MODEL_WIDTHS: dict[str, list[int]] = {
    "small": [784, 1024, 512, 256, 10],
    "medium": [784, 2048, 2048, 1024, 512, 10],
    "large": [784, 4096, 4096, 2048, 2048, 1024, 512, 10],
    "xlarge": [784, 4096, 4096, 4096, 2048, 2048, 1024, 512, 10],
    # the explainer's deep model: 40 Linear layers, 4096 wide
    "deep40": [784] + [4096] * 39 + [10],
}
MODELS = tuple(MODEL_WIDTHS)
STRATEGIES = ("naive", "interleaved", "ddp", "single", "fsdp")
# a user's pipeline (torch.distributed.pipelining), drawn as its schedule: GPipe, 1F1B,
# interleaved 1F1B, looped BFS, interleaved zero bubble, ZBV zero bubble, DualPipeV
PIPELINE_STRATEGIES = ("gpipe", "1f1b", "interleaved1f1b", "loopedbfs", "interleavedzb", "zbv", "dualpipev")
WIRE_STRATEGIES = STRATEGIES + PIPELINE_STRATEGIES  # any a rank may send
# the built-in workers' pipelines (`ddptui --strategies naive,ddp,gpipe,1f1b`): the model's
# blocks split into one stage a rank, `--microbatches` of the global batch a step
BUILTIN_PIPELINES = ("gpipe", "1f1b")
DEFAULT_MICROBATCHES = 4
DEFAULT_STRATEGIES = ("naive", "ddp")
BUCKET_LADDER_MB = (1.0, 5.0, 25.0, 100.0)
DEFAULT_BUCKET_CAP_MB = 25.0  # PyTorch's default
# the strategy a user's own DDP (ddptui run, ddptui.instrument) and an opened torch.profiler
# trace are drawn as: the DDP pane (buckets, figures, stragglers)
USER_STRATEGY = "ddp"
# ... and a user's FSDP2 model (fully_shard): the fsdp pane (its all-gathers and reduce-scatters)
USER_FSDP_STRATEGY = "fsdp"
SPEED_LADDER = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # replay speeds, slowest to fastest
BYTES_PER_GRAD = 4  # fp32 gradients: bytes an AllReduce carries per parameter element

# -- collectives: the vocabulary, written once ------------------------------------------------
# what a COLL span (ranks.wire) can be: the kinds of torch.distributed collectives, as the
# process group is asked for them (every public entry point ends in one of these)
COLL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "barrier",
            "reduce", "gather", "scatter", "send", "recv")
COLL_SHORT = {"all_reduce": "AR", "all_gather": "AG", "reduce_scatter": "RS", "all_to_all": "A2A",
              "broadcast": "BC", "barrier": "BAR", "reduce": "RED", "gather": "GA", "scatter": "SC",
              "send": "SEND", "recv": "RECV"}
# the pass a collective was issued in (a COLL row's `phase`): by a layer's forward or
# backward, by the optimizer, or elsewhere in the step (between layers, the script's own)
COLL_PHASES = ("forward", "backward", "optimizer", "step")


def bus_factor(op: str, n: int) -> float:
    """Bytes a ring moves per byte of the collective's buffer, per rank (NCCL's bus bandwidth
    factors): all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n (of the
    full, gathered buffer); broadcast, reduce, send, recv 1; barrier 0. One rank: 0."""
    if n <= 1 or op == "barrier":
        return 0.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    return 1.0


def strategy_ranks(strategy: str, world: int) -> int:
    """How many ranks run a strategy: `single` runs on rank 0 alone, the others on every rank."""
    return 1 if strategy == "single" else world


def grad_bytes(params) -> list[int]:
    """Gradient bytes of each parameter of a param_table (or of its list form in frames)."""
    return [int(p[1]) * BYTES_PER_GRAD for p in params]


def layer_names(model: str) -> list[str]:
    return [f"fc{i + 1}" for i in range(len(MODEL_WIDTHS[model]) - 1)]


def param_table(model: str) -> list[tuple[str, int, int]]:
    """(name, numel, layer index) for every parameter tensor, in model.parameters() order."""
    widths = MODEL_WIDTHS[model]
    out = []
    for i in range(len(widths) - 1):
        out.append((f"fc{i + 1}.0.weight", widths[i] * widths[i + 1], i))
        out.append((f"fc{i + 1}.0.bias", widths[i + 1], i))
    return out


def param_count(model: str) -> int:
    return sum(n for _, n, _ in param_table(model))


def parse_strategies(text: str) -> list[str]:
    """'naive,ddp' -> ['naive', 'ddp']; raises ValueError with a one-line reason."""
    names = [s.strip().lower() for s in text.split(",") if s.strip()]
    known = STRATEGIES + BUILTIN_PIPELINES
    if not names:
        raise ValueError("--strategies is empty; choose from " + ", ".join(known))
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"unknown strategy {bad[0]!r}; choose from " + ", ".join(known))
    seen: list[str] = []
    for n in names:
        if n not in seen:
            seen.append(n)
    return seen


def parse_slow_rank(text: str, model: str, world: int | None = None) -> tuple[int, float, int]:
    """'R:MS[:LAYER]' -> (rank, ms, layer index); LAYER defaults to the middle layer.
    ValueError with a one-line reason."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"--slow-rank wants RANK:MS[:LAYER], e.g. 1:40:fc2 (got {text!r})")
    try:
        rank, ms = int(parts[0]), float(parts[1])
    except ValueError:
        raise ValueError(f"--slow-rank wants a whole rank and a number of ms (got {text!r})") from None
    if rank < 0 or (world is not None and rank >= world):
        raise ValueError(f"--slow-rank: rank {rank} is not one of the run's ranks 0..{(world or 1) - 1}")
    if not (0 <= ms <= 60_000) or ms != ms:
        raise ValueError(f"--slow-rank: the delay must be 0..60000 ms (got {parts[1]})")
    names = layer_names(model)
    layer = (len(names) - 1) // 2 if len(parts) == 2 else None
    if layer is None:
        if parts[2] not in names:
            raise ValueError(f"--slow-rank: model {model} has no layer {parts[2]!r} "
                             f"(layers {names[0]}..{names[-1]})")
        layer = names.index(parts[2])
    return rank, ms, layer


# Layer marks on a sample of steps (ranks.core.instrument): the longest period (the per-layer
# evidence judges windows of 20 steps with their layers marked: the app keeps the last 20
# complete ones among its 400 steps however old, Store.stays; at 128, 20 of them span ~2.6 s
# of 1 ms steps), and what --layer-every takes (powers of two: every rank marks the same
# steps, those a multiple of the period)
MAX_LAYER_EVERY = 128
LAYER_EVERY = ("auto",) + tuple(str(2 ** i) for i in range(MAX_LAYER_EVERY.bit_length()))


# how DDP's buckets were timed (the `comm_timing` event's value): ddptui's Python comm hook, or
# NCCL's own timing read from PyTorch's Flight Recorder (ranks.builtin.strategies.comm_timing_for)
COMM_TIMING = {"comm-hook": 1, "flight-recorder": 2}
COMM_TIMING_NAMES = {v: k for k, v in COMM_TIMING.items()}
