"""Who waits for whom: per-collective arrival, wait vs transfer, the culprit rank and layer.

Pure functions over one strategy step's span batches (one per rank). A collective (an
AllReduce of one parameter, or of one DDP bucket) is READY on a rank when that rank handed it
to the backend (on GPU: when its stream reached it); the spans' issue column carries that
time. Across ranks:

    last arriver   the rank whose ready time is latest
    wait (rank)    last arriver's ready - own ready: time spent waiting for the others
    transfer       end - last arriver's ready: the collective itself, once all are there

Per rank and step, waiting is the union of its waiting intervals (buckets in flight together
do not count twice). The culprit of a step is the rank that made the others wait longest;
its layer is the one whose backward ran longest against the other ranks' median for it.

Times are put on one axis by `to_common(rank, ns)` first: identity on one host (one
CLOCK_MONOTONIC); per-host clock offsets plug in there.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

from ranks.wire import BWD, COMM

# a step names a culprit only when someone waited at least this long for it: below it, who
# arrives last is scheduling noise (measured: README "Who waits for whom")
MIN_CULPRIT_WAIT_MS = 2.0
MIN_CULPRIT_SHARE = 0.05  # ... and at least this share of the step
# a strategy names a culprit only when the same rank held the others up in this share of its
# steps: on 2 busy cores, with no delay injected, either rank is now and then 10-30 ms late
# (measured: README "Who waits for whom")
MIN_CULPRIT_STEPS_PCT = 85.0


def same_clock(rank: int, ns: int) -> int:
    return ns


@dataclass
class Collective:
    idx: int
    nth: int  # the nth AllReduce of this parameter/bucket in the step (see comm_spans)
    ready: dict[int, int]  # rank -> ns
    end: dict[int, int]
    last: int  # the last arriver
    last_ready: int

    def wait_ns(self, rank: int) -> int:
        return self.last_ready - self.ready[rank]

    @property
    def transfer_ns(self) -> int:
        return int(median(max(0, e - self.last_ready) for e in self.end.values()))


@dataclass
class StepWaits:
    """Who waited for whom in one strategy step."""
    collectives: list[Collective]
    wait_ms: dict[int, float]  # per rank: union of its waiting intervals
    caused_ms: dict[int, float]  # per rank: how long the others waited for it (max over them)
    transfer_ms: float  # median over the collectives
    last_arriver: int | None  # the rank the others waited longest for; None: nobody waited
    culprit: tuple[int, int, float] | None = None  # (rank, layer, ms over the others) when clear
    layer_excess_ms: dict[int, float] = field(default_factory=dict)


def comm_spans(b):
    """A span batch's AllReduces: (span index, ready time in µs after the batch's base,
    (idx, nth)). (idx, nth) — the nth AllReduce of that parameter or bucket in the step — is
    what names the same collective on every rank."""
    seen: dict[int, int] = {}
    ci = 0
    for i in range(len(b.kind)):
        if b.kind[i] == COMM:
            idx = b.idx[i]
            n = seen.get(idx, 0)
            seen[idx] = n + 1
            yield i, b.iss[ci], (idx, n)
            ci += 1


def collectives(batches: dict, to_common=same_clock) -> list[Collective]:
    """The step's collectives present on every rank, in the first rank's issue order."""
    per_rank: dict[int, dict[tuple[int, int], tuple[int, int]]] = {}
    order: list[tuple[int, int]] = []
    for r, b in sorted(batches.items()):
        got = {key: (to_common(r, b.base_ns + ready_us * 1000), to_common(r, b.base_ns + b.t1[i] * 1000))
               for i, ready_us, key in comm_spans(b)}
        per_rank[r] = got
        if not order:
            order = list(got)
    out = []
    for key in order:
        if not all(key in g for g in per_rank.values()):
            continue
        ready = {r: g[key][0] for r, g in per_rank.items()}
        end = {r: g[key][1] for r, g in per_rank.items()}
        last = max(ready, key=lambda r: (ready[r], -r))
        out.append(Collective(key[0], key[1], ready, end, last, ready[last]))
    return out


def _union_ns(intervals: list[tuple[int, int]]) -> int:
    total, cur_a, cur_z = 0, None, None
    for a, z in sorted(intervals):
        if z <= a:
            continue
        if cur_z is None or a > cur_z:
            if cur_z is not None:
                total += cur_z - cur_a
            cur_a, cur_z = a, z
        else:
            cur_z = max(cur_z, z)
    if cur_z is not None:
        total += cur_z - cur_a
    return total


def backward_ms(b) -> dict[int, float]:
    """layer -> this rank's backward duration in ms."""
    return {b.idx[i]: (b.t1[i] - b.t0[i]) / 1000 for i in range(len(b.kind)) if b.kind[i] == BWD}


def step_waits(batches: dict, step_ms: float, to_common=same_clock) -> StepWaits | None:
    """None for a step without collectives on two or more ranks."""
    if len(batches) < 2:
        return None
    cols = collectives(batches, to_common)
    if not cols:
        return None
    ranks = sorted(batches)
    wait = {r: _union_ns([(c.ready[r], c.last_ready) for c in cols]) / 1e6 for r in ranks}
    caused = {r: 0.0 for r in ranks}
    for c in cols:
        worst = max(c.wait_ns(r) for r in ranks) / 1e6
        caused[c.last] = max(caused[c.last], worst)
    last = max(ranks, key=lambda r: (caused[r], -r))
    transfer = median(c.transfer_ns for c in cols) / 1e6
    sw = StepWaits(cols, wait, caused, transfer, last if caused[last] > 0 else None)
    waited = caused[last]
    if waited >= MIN_CULPRIT_WAIT_MS and waited >= MIN_CULPRIT_SHARE * step_ms:
        bw = {r: backward_ms(batches[r]) for r in ranks}
        mine = bw[last]
        others = [r for r in ranks if r != last]
        excess = {}
        for layer, d in mine.items():
            ref = [bw[r][layer] for r in others if layer in bw[r]]
            if ref:
                excess[layer] = d - median(ref)
        sw.layer_excess_ms = excess
        if excess:
            layer = max(excess, key=excess.get)
            sw.culprit = (last, layer, excess[layer])
    return sw


def culprit_text(culprit: tuple[int, int, float] | None, layer_names: list[str]) -> str:
    """'rank 1 · fc2 backward +38 ms' (or '' when no rank held the others up)."""
    if culprit is None:
        return ""
    r, layer, ms = culprit
    name = layer_names[layer] if 0 <= layer < len(layer_names) else f"layer {layer}"
    return f"rank {r} · {name} backward {ms:+.0f} ms" if abs(ms) >= 1 else \
        f"rank {r} · {name} backward {ms:+.1f} ms"


def summarize(steps: list[StepWaits | None], layer_names: list[str]) -> dict | None:
    """A strategy's figures over its steps: `last_arriver_rank` (the rank the others waited for
    longest, most often) and `last_arriver_pct` (in how many steps), `wait_ms_median` per rank,
    `transfer_ms_median`, `culprit_layer` (that rank's most frequent culprit layer, among the
    steps where it clearly held the others up) and `culprit` (in words) — only when that rank
    was last in at least MIN_CULPRIT_STEPS_PCT % of the steps —, `named_pct` (share of steps
    where a culprit was clear)."""
    steps = [s for s in steps if s is not None]
    if not steps:
        return None
    ranks = sorted(steps[0].wait_ms)
    out = {
        "last_arriver_rank": None, "last_arriver_pct": 0.0,
        "wait_ms_median": {str(r): round(median(s.wait_ms.get(r, 0.0) for s in steps), 3) for r in ranks},
        "transfer_ms_median": round(median(s.transfer_ms for s in steps), 3),
        "culprit_layer": None, "culprit": "", "steps": len(steps),
        "named_pct": round(100.0 * sum(1 for s in steps if s.culprit) / len(steps), 1),
    }
    counts: dict[int, int] = {}
    for s in steps:
        if s.last_arriver is not None:
            counts[s.last_arriver] = counts.get(s.last_arriver, 0) + 1
    if not counts:
        return out
    rank = max(counts, key=lambda r: (counts[r], -r))
    out["last_arriver_rank"] = rank
    out["last_arriver_pct"] = round(100.0 * counts[rank] / len(steps), 1)
    layers: dict[int, list[float]] = {}
    for s in steps:
        if s.culprit is not None and s.culprit[0] == rank:
            layers.setdefault(s.culprit[1], []).append(s.culprit[2])
    if layers and out["last_arriver_pct"] >= MIN_CULPRIT_STEPS_PCT:
        layer = max(layers, key=lambda k: (len(layers[k]), median(layers[k])))
        out["culprit_layer"] = layer_names[layer] if 0 <= layer < len(layer_names) else str(layer)
        out["culprit"] = culprit_text((rank, layer, median(layers[layer])), layer_names)
    return out
