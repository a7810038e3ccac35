"""A pipeline's figures (torch.distributed.pipelining, ranks.core.pipetap): the bubble, per
rank and per step, beside what the schedule plans, and the stage the bubble waits for.

The bubble of a rank's step: the share of its schedule's step() call (the PIPE span) in which
the rank ran no microbatch (no MB span: a chunk's forward, backward, or a zero-bubble
schedule's input-grad and weight-grad halves). What is left is the stage idle: waiting for its
neighbour's activations or gradients (a receive; on CPU ranks a send waits too) or for nothing
(the schedule's order). The plan: the schedule's own idle share with every action one time
unit (GPipe and 1F1B: (p - 1) / (m + p - 1); others from their `pipeline_order`), said by the
ranks (RunInfo.pipeline). A measured bubble above the plan is a stage slower than the others,
or communication the plan counts as free; the stage with the most compute a step is named as
the one the bubble waits for when it computes 25 % more than the median of the others.
Pure functions of span batches (no Store import).
"""
from __future__ import annotations

import statistics

from ranks import spec
from ranks.wire import BWD, FWD, MB, SpanBatch, mb_of

from .figures import pipe_busy

def pipelined(meta, strategy: str) -> bool:
    """Whether a strategy's ranks are a pipeline's stages (each holding other layers under the
    same layer index): a pipeline's schedule, or a user's model in a pipeline (its DDP or FSDP2
    stages); the built-in naive and DDP beside the built-in pipelines are not."""
    if strategy in spec.PIPELINE_STRATEGIES:
        return True
    return getattr(meta, "pipeline", None) is not None and getattr(meta, "model", None) not in spec.MODELS


SLOW_STAGE_EXCESS = 1.25  # a stage computing this much more than the others' median is named (CPU ranks on shared cores differ by 10-20 % alone)


def rank_step(b: SpanBatch) -> dict | None:
    """One rank's step of a pipeline: {"pipe_ms", "busy_ms", "bubble_pct", "microbatches",
    "stages"} (busy: the union of its microbatch spans inside its schedule's steps); None for a
    batch with no schedule step."""
    got = pipe_busy(b)
    if got is None or got[0] <= 0:
        return None
    pipe_us, busy = got
    kind, idx = b.kind, b.idx
    parts = [mb_of(idx[i]) for i in range(len(kind)) if kind[i] == MB]
    return {"pipe_ms": pipe_us / 1e3, "busy_ms": busy / 1e3, "bubble_pct": 100.0 * max(0, pipe_us - busy) / pipe_us,
            "microbatches": len({(s, m) for s, m, p in parts if p == 0}),
            "stages": sorted({s for s, _, _ in parts})}


def layer_compute_us(b: SpanBatch) -> dict[int, int]:
    """layer -> its forward and backward time in the step (µs, every microbatch's)."""
    out: dict[int, int] = {}
    kind, idx, t0, t1 = b.kind, b.idx, b.t0, b.t1
    for i in range(len(kind)):
        if kind[i] == FWD or kind[i] == BWD:
            out[idx[i]] = out.get(idx[i], 0) + t1[i] - t0[i]
    return out


def summarize(steps: list[dict[int, SpanBatch]], info: dict | None, layers: list[str]) -> dict | None:
    """The pipeline's figures over steps (rank -> batch each; the caller leaves the warm-up
    out): per rank the median bubble, busy and step time; the plan; the slowest stage when
    one stands out. None where no step holds a schedule's step."""
    per: dict[int, list[dict]] = {}
    layer_us: dict[int, dict[int, list[int]]] = {}
    for ranks in steps:
        for r, b in ranks.items():
            got = rank_step(b)
            if got is None:
                continue
            per.setdefault(r, []).append(got)
            for layer, us in layer_compute_us(b).items():
                layer_us.setdefault(r, {}).setdefault(layer, []).append(us)
    if not per:
        return None
    ranks_out = {}
    for r, rows in sorted(per.items()):
        ranks_out[str(r)] = {
            "bubble_pct": round(statistics.median(x["bubble_pct"] for x in rows), 1),
            "busy_ms": round(statistics.median(x["busy_ms"] for x in rows), 3),
            "pipe_ms": round(statistics.median(x["pipe_ms"] for x in rows), 3),
            "microbatches": statistics.median(x["microbatches"] for x in rows),
            "stages": rows[-1]["stages"],
            "steps": len(rows)}
    info = info or {}
    plan = info.get("plan_idle")
    out = {"schedule": info.get("schedule"), "stages": info.get("stages"),
           "microbatches": info.get("microbatches"), "ranks": ranks_out,
           "bubble_pct": round(statistics.mean(v["bubble_pct"] for v in ranks_out.values()), 1),
           "definition": "share of each rank's schedule step() in which it ran no microbatch "
                         "(idle, or waiting for a neighbour's activations or gradients)"}
    if isinstance(plan, dict) and plan:  # (each rank's, as it said it)
        out["plan_pct"] = {r: round(100.0 * plan[r], 1) for r in sorted(plan, key=int)}
        out["plan_bubble_pct"] = round(100.0 * statistics.mean(plan.values()), 1)
    slow = slowest_stage(ranks_out, layer_us, layers, info.get("rank_layers") or {})
    if slow is not None:
        out["slowest"] = slow
    return out


def slowest_stage(ranks_out: dict, layer_us: dict, layers: list[str], rank_layers: dict) -> dict | None:
    """The rank whose microbatches take longest a step, when it computes SLOW_STAGE_EXCESS
    times the median of the others or more: {"rank", "stages", "busy_ms", "others_ms",
    "ratio", "layers": its two costliest layers (name, ms a step)}."""
    if len(ranks_out) < 2:
        return None
    busy = {int(r): v["busy_ms"] for r, v in ranks_out.items()}
    r = max(busy, key=busy.get)
    others = statistics.median(v for k, v in busy.items() if k != r)
    if others <= 0 or busy[r] < SLOW_STAGE_EXCESS * others:
        return None
    costly = sorted(((statistics.median(v) / 1e3, layer) for layer, v in layer_us.get(r, {}).items()),
                    reverse=True)[:2]
    names = rank_layers.get(str(r)) or layers  # (the rank's own names: each rank holds other layers)
    return {"rank": r, "stages": ranks_out[str(r)]["stages"], "busy_ms": busy[r], "others_ms": round(others, 3),
            "ratio": round(busy[r] / others, 2),
            "layers": [[names[i] if 0 <= i < len(names) else f"layer {i}", round(ms, 3)] for ms, i in costly]}


def line(strategy: str, p: dict) -> str:
    """The summary's line: 'pipeline 1f1b: 2 stages × 4 microbatches · bubble r0 31 %, r1 28 %
    (plan 20 %) · the bubble waits for rank 1 (stage 1): 1.8x the others' compute (fc2, fc1)'."""
    head = f"pipeline {strategy}"
    if p.get("stages") and p.get("microbatches"):
        head += f": {p['stages']} stages × {p['microbatches']} microbatches"
    per = ", ".join(f"r{r} {v['bubble_pct']:.0f} %" for r, v in p["ranks"].items())
    text = f"{head} · bubble {per}"
    if "plan_bubble_pct" in p:
        plan = set(p["plan_pct"].values())
        text += f" (plan {p['plan_bubble_pct']:.0f} %)" if len(plan) == 1 else \
            " (plan " + ", ".join(f"r{r} {v:.0f} %" for r, v in p["plan_pct"].items()) + ")"
    slow = p.get("slowest")
    if slow is not None:
        st = ", ".join(str(s) for s in slow["stages"])
        names = ", ".join(n for n, _ in slow["layers"])
        text += (f" · the bubble waits for rank {slow['rank']} (stage {st}): {slow['ratio']:.1f}x the others' "
                 f"compute" + (f" ({names})" if names else ""))
    return text
