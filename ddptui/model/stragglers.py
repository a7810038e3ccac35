"""Who waits for whom: per-collective arrival, wait vs transfer, the culprit rank and layer.

Pure functions over one strategy step's span batches (one per rank). A collective (an
AllReduce of one parameter, of one DDP bucket, or any other collective: a COLL span) is READY on a rank when that rank handed it
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

A collective on a group of some of the ranks (a device mesh dimension's: the `tp` group of
ranks 0 and 1, another of ranks 2 and 3) is the same table row on each, but as many
collectives as the dimension has groups: `split_by_group` matches it within each group
(`groups`: rank -> row id -> (the group's lowest rank, its label), Store.coll_group_rows), and
each rank's wait is said per group too (`StepWaits.wait_by_group`: tp, dp).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

from ranks.wire import BWD, COLL, COMM

from . import evidence as layer_evidence
from .columns import layers_marked, placement
from .kept import Kept
from .stacked import same_clock, sections_excess

# a step names a culprit only when someone waited at least this long for it: below it, who
# arrives last is scheduling noise (measured: benchmarks/README.md "Who waits for whom: measured")
MIN_CULPRIT_WAIT_MS = 2.0
MIN_CULPRIT_SHARE = 0.05  # ... and at least this share of the step
# a strategy names a culprit only when the same rank held the others up in this share of its
# steps: on 2 busy cores, with no delay injected, either rank is now and then 10-30 ms late
# (measured: benchmarks/README.md "Who waits for whom: measured")
MIN_CULPRIT_STEPS_PCT = 85.0


@dataclass
class Collective:
    idx: int
    nth: int  # the nth collective of this kind and idx in the step (see comm_spans)
    ready: dict[int, int]  # rank -> ns
    end: dict[int, int]
    last: int  # the last arriver
    last_ready: int
    kind: int = COMM  # COMM (idx: a parameter or bucket) or COLL (idx: a collectives table row)
    group: int | None = None  # on a group of some of the ranks: its lowest rank (split_by_group)
    label: str = ""  # its group's label (collectives.group_label), where not the default group

    @property
    def key(self) -> tuple[int, int, int]:
        """(kind, idx, nth): columns.Placement.comm_keys."""
        return (self.kind, self.idx, self.nth)

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
    step: int = -1
    t_ns: int = 0  # the step's start (earliest rank)
    batches: dict | None = field(default=None, repr=False)  # rank -> span batch, for the evidence
    # with collectives on other groups than the default one (a device mesh): group label ->
    # rank -> its wait in that group's collectives (ms); None without
    wait_by_group: dict[str, dict[int, float]] | None = None
    _evidence: tuple | None = field(default=None, repr=False, compare=False)  # (made from batches)

    def _sections_excess_ref(self) -> tuple[tuple, dict, dict]:
        """Per-layer evidence (ddptui/model/evidence.py), worked out when first asked for (the
        panel asks for the last steps only): every rank's (pass, layer) -> ms, flattened; per
        rank and (pass, layer), own ms - the other ranks' median; per (pass, layer), the
        median over ranks."""
        if self._evidence is None:
            got = sections_excess(self.batches) if self.batches else None
            if got is None:  # (ranks with different columns, several hosts: rank by rank)
                secs = layer_evidence.step_sections(self.batches) if self.batches else {}
                got = (layer_evidence.flatten(secs), *layer_evidence.step_excess(secs))
            self._evidence = got
        return self._evidence

    def set_evidence(self, got: tuple) -> None:
        """The per-layer evidence made ahead (columnwise.sections_excess of the step's matrices)."""
        self._evidence = got

    @property
    def flat(self) -> tuple:
        return self._sections_excess_ref()[0]

    @property
    def excess(self) -> dict:
        return self._sections_excess_ref()[1]

    @property
    def ref(self) -> dict:
        return self._sections_excess_ref()[2]


def layered(s: StepWaits) -> bool:
    """Whether a step's layers were marked (its first rank's batch: the ranks mark the same
    steps), not its forward and backward as a whole."""
    b = next(iter(s.batches.values()), None)
    return b is not None and layers_marked(b)


def comm_spans(b):
    """A span batch's collectives (COMM and COLL): (span index, ready time in µs after the
    batch's base, (kind, idx, nth)). (kind, idx, nth) — the nth collective of that kind and idx
    in the step — is what names the same collective on every rank (columns.Placement.comm_keys)."""
    place = placement(b)
    return zip(place.comm, b.iss, place.comm_keys)


def _rank_comms(r: int, b, to_common) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """(keys (kind, idx, nth), ready ns, end ns) of one rank's collectives, in its order, on the
    common clock (this runs for every rank of every step: column-wise, no loop over spans)."""
    place = placement(b)
    pos, keys = place.comm, place.comm_keys
    base, t1 = b.base_ns, b.t1
    ready = [base + x * 1000 for x in b.iss]
    end = [base + t1[i] * 1000 for i in pos]
    if to_common is not same_clock:
        ready = [to_common(r, v) for v in ready]
        end = [to_common(r, v) for v in end]
    return keys, ready, end


def collectives(batches: dict, to_common=same_clock) -> list[Collective]:
    """The step's collectives present on every rank, in the first rank's issue order."""
    ranks = sorted(batches)
    got = [_rank_comms(r, batches[r], to_common) for r in ranks]
    if not got:
        return []
    keys = got[0][0]
    out = []
    if all(g[0] is keys for g in got):  # the same AllReduces on every rank: column by column
        for key, rcol, ecol in zip(keys, zip(*(g[1] for g in got)), zip(*(g[2] for g in got))):
            last_ready = max(rcol)
            last = ranks[rcol.index(last_ready)]  # (the lowest rank among those tied)
            out.append(Collective(key[1], key[2], dict(zip(ranks, rcol)), dict(zip(ranks, ecol)), last, last_ready,
                                  key[0]))
        return out
    per_rank = [dict(zip(k, zip(rd, en))) for k, rd, en in got]
    for key in keys:
        try:
            both = [g[key] for g in per_rank]
        except KeyError:
            continue
        ready = {r: v[0] for r, v in zip(ranks, both)}
        end = {r: v[1] for r, v in zip(ranks, both)}
        last = max(ready, key=lambda r: (ready[r], -r))
        out.append(Collective(key[1], key[2], ready, end, last, ready[last], key[0]))
    return out


def split_by_group(cols: list[Collective], groups: dict | None) -> list[Collective] | None:
    """`cols` with each collective on another group than the default one labelled with it,
    and each run on groups of some of the ranks made one per group (its ranks' ready and end,
    its own last arriver; `group`: its lowest rank); None when no collective is on another
    group (a run without a device mesh: `groups` empty). groups: rank -> row id -> (the
    group's lowest rank or None, its label)."""
    if not groups:
        return None
    out: list[Collective] = []
    for c in cols:
        if c.kind != COLL:
            out.append(c)
            continue
        parts: dict = {}
        for r in c.ready:
            parts.setdefault(groups.get(r, {}).get(c.idx), []).append(r)
        if len(parts) == 1:  # (one group, or none said)
            got = next(iter(parts))
            if got is not None:
                c.label = got[1]
            out.append(c)
            continue
        for got, rs in parts.items():
            ready = {r: c.ready[r] for r in rs}
            last = max(rs, key=lambda r: (ready[r], -r))
            out.append(Collective(c.idx, c.nth, ready, {r: c.end[r] for r in rs}, last, ready[last], c.kind,
                                  got[0] if got is not None else None, got[1] if got is not None else ""))
    return out


def arrival_key(c: Collective) -> tuple:
    """What names a collective's arrival (views.RankSpans): its key, with its group's lowest
    rank where it ran on groups of some of the ranks (`rank_arrival_keys`)."""
    return c.key if c.group is None else (*c.key, c.group)


def rank_arrival_keys(keys, mine: dict | None) -> list[tuple]:
    """A rank's collectives' keys (columns.Placement.comm_keys) as `arrival_key` says them:
    mine: id -> (its group's lowest rank or None, label), of the rank's rows on other groups
    than the default one (Store.coll_group_rows)."""
    if not mine:
        return list(keys)
    out = []
    for k in keys:
        got = mine.get(k[1]) if k[0] == COLL else None
        out.append(k if got is None or got[0] is None else (*k, got[0]))
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


def _step_start_ns(b) -> int:
    """A batch's STEP span start (its base when it has none): a rank's OTHER spans (an
    evaluation before the step) may start before it, and move the base back."""
    i = placement(b).step
    return b.base_ns if i is None else b.base_ns + b.t0[i] * 1000


def step_waits(batches: dict, step_ms: float, to_common=same_clock, groups: dict | None = None) -> StepWaits | None:
    """None for a step without collectives on two or more ranks. groups: rank -> row id ->
    (its group's lowest rank or None, its label), of the rows on other groups than the
    default one (split_by_group)."""
    if len(batches) < 2:
        return None
    cols = collectives(batches, to_common)
    if not cols:
        return None
    ranks = sorted(batches)
    split = split_by_group(cols, groups)
    by_group = None
    if split is None:
        wait = {r: _union_ns([(c.ready[r], c.last_ready) for c in cols]) / 1e6 for r in ranks}
    else:
        cols = split
        wait = {r: _union_ns([(c.ready[r], c.last_ready) for c in cols if r in c.ready]) / 1e6 for r in ranks}
        by_group = {}
        for label in dict.fromkeys(c.label or "world" for c in cols):
            mine = [c for c in cols if (c.label or "world") == label]
            by_group[label] = {r: _union_ns([(c.ready[r], c.last_ready) for c in mine if r in c.ready]) / 1e6
                               for r in ranks if any(r in c.ready for c in mine)}
    caused = {r: 0.0 for r in ranks}
    for c in cols:
        worst = (c.last_ready - min(c.ready.values())) / 1e6
        caused[c.last] = max(caused[c.last], worst)
    last = max(ranks, key=lambda r: (caused[r], -r))
    transfer = median(c.transfer_ns for c in cols) / 1e6
    sw = StepWaits(cols, wait, caused, transfer, last if caused[last] > 0 else None)
    sw.wait_by_group = by_group
    any_b = next(iter(batches.values()))
    sw.step, sw.t_ns = any_b.step, min(to_common(r, _step_start_ns(b)) for r, b in batches.items())
    sw.batches = dict(batches)
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


WAITS_LISTED_MAX = 8  # beyond this many ranks, waits are said as a spread, not rank by rank


def wait_spread(wait_ms: dict) -> str:
    """Many ranks' median waits in one line: 'median 1.0 · p95 1.9 · most r5 2.3 · least
    r700 0.0 ms' (the rank that waits least is the one the others wait for)."""
    vals = sorted((v, int(r)) for r, v in wait_ms.items())
    if not vals:
        return ""
    q = lambda p: vals[min(len(vals) - 1, int(p * (len(vals) - 1) + 0.5))][0]  # noqa: E731
    (lo, r_lo), (hi, r_hi) = vals[0], vals[-1]
    return (f"median {q(0.5):.1f} · p95 {q(0.95):.1f} · most r{r_hi} {hi:.1f} · "
            f"least r{r_lo} {lo:.1f} ms over {len(vals)} ranks")


def culprit_text(culprit: tuple[int, int, float] | None, layer_names: list[str]) -> str:
    """'rank 1 · fc2 backward +38 ms' (or '' when no rank held the others up)."""
    if culprit is None:
        return ""
    r, layer, ms = culprit
    name = layer_names[layer] if 0 <= layer < len(layer_names) else f"layer {layer}"
    return f"rank {r} · {name} backward {ms:+.0f} ms" if abs(ms) >= 1 else \
        f"rank {r} · {name} backward {ms:+.1f} ms"


def summarize(steps: list[StepWaits | None], layer_names: list[str],
              evidence_steps: list[StepWaits] | None = None, per_layer: bool = True) -> dict | None:
    """A strategy's figures over its steps: `last_arriver_rank` (the rank the others waited for
    longest, most often) and `last_arriver_pct` (in how many steps), `wait_ms_median` per rank,
    `transfer_ms_median`, `culprit_layer` (that rank's most frequent culprit layer, among the
    steps where it clearly held the others up) and `culprit` (in words) — only when that rank
    was last in at least MIN_CULPRIT_STEPS_PCT % of the steps —, `named_pct` (share of steps
    where a culprit was clear), `wait_ms_median_by_group` (a device mesh: group label -> rank
    -> its median wait in that group's collectives). `evidence`: the per-layer evidence (see `evidence()`); when it
    names a slow rank and section, that is the culprit (`culprit_from` "layers", else
    "arrival"), `culprit_rank` its rank.

    No verdict before there is evidence: until a full window (evidence.WINDOW steps) has
    been seen, nothing is named (`gathering` True, `evidence_steps` of `window_steps`; a few
    steps of two ranks on busy cores name anyone); `gathering_text` says so.
    `evidence_steps`: the steps the per-layer evidence is over, where not these (layers
    marked on a sample of steps: as many steps as hold a window of marked ones)."""
    steps = [s for s in steps if s is not None]
    if not steps:
        return None
    ranks = sorted(steps[0].wait_ms)
    out = {
        "last_arriver_rank": None, "last_arriver_pct": 0.0,
        "wait_ms_median": _wait_medians(steps, ranks),
        "transfer_ms_median": round(median(s.transfer_ms for s in steps), 3),
        "culprit_layer": None, "culprit": "", "culprit_rank": None, "culprit_from": None, "steps": len(steps),
        "named_pct": round(100.0 * sum(1 for s in steps if s.culprit) / len(steps), 1),
    }
    by_group = _group_medians(steps)
    if by_group:  # (a device mesh: the waits in each dimension's collectives)
        out["wait_ms_median_by_group"] = by_group
    # (per_layer False: a pipeline, whose ranks hold different layers under the same index: no
    # layer is compared across ranks, no culprit named from layers; the pipeline's own figures
    # name the stage its bubble waits for)
    ev = evidence(steps if evidence_steps is None else evidence_steps, layer_names) if per_layer else None
    out["evidence"] = ev
    have = ev["steps"] if ev else len(steps)
    out.update(evidence_steps=have, window_steps=layer_evidence.WINDOW,
               gathering=per_layer and have < layer_evidence.WINDOW)  # (a pipeline: no culprit to gather for)
    counts: dict[int, int] = {}
    for s in steps:
        if s.last_arriver is not None:
            counts[s.last_arriver] = counts.get(s.last_arriver, 0) + 1
    if counts:
        rank = max(counts, key=lambda r: (counts[r], -r))
        out["last_arriver_rank"] = rank
        out["last_arriver_pct"] = round(100.0 * counts[rank] / len(steps), 1)
        if per_layer:
            _arrival_culprit(out, steps, rank, layer_names)
    if out["gathering"]:  # who arrived last, but no culprit yet
        out.update(culprit_layer=None, culprit="", culprit_rank=None, culprit_from=None)
    elif ev and ev["culprit"]:  # the per-layer evidence names the culprit when it can
        c = ev["culprit"]
        out.update(culprit=c["text"], culprit_layer=c["layer"], culprit_rank=c["rank"], culprit_from="layers")
    return out


def _group_medians(steps: list[StepWaits]) -> dict[str, dict[str, float]] | None:
    """group label -> rank -> its median wait in that group's collectives over the steps
    (each step's wait_by_group; None where no step has other groups than the default one)."""
    got: dict[str, dict[str, list[float]]] = {}
    for s in steps:
        for label, waits in (s.wait_by_group or {}).items():
            if ">" in label or "<" in label:  # (a pipeline's send or receive, by its peer: no
                continue  # collective every rank of a group enters, nobody arrives last in it)
            g = got.setdefault(label, {})
            for r, v in waits.items():
                g.setdefault(str(r), []).append(v)
    if not got:
        return None
    return {label: {r: round(median(v), 3) for r, v in sorted(g.items(), key=lambda x: int(x[0]))}
            for label, g in got.items()}


def _wait_medians(steps: list[StepWaits], ranks: list[int]) -> dict[str, float]:
    """Per rank (as text), the median of its waits over the steps, rounded to µs: with many
    ranks, column-wise (numpy's median of a column is statistics.median's, value for value)."""
    if len(ranks) < 64:
        return {str(r): round(median(s.wait_ms.get(r, 0.0) for s in steps), 3) for r in ranks}
    import numpy as np
    m = np.array([[s.wait_ms.get(r, 0.0) for r in ranks] for s in steps], dtype=np.float64)
    return {str(r): round(v, 3) for r, v in zip(ranks, np.median(m, axis=0).tolist())}


def gathering_text(got: dict | None) -> str:
    """'gathering evidence (3/20 steps)' while a summary has fewer steps than a verdict needs,
    else ''."""
    if not got or not got.get("gathering"):
        return ""
    return f"gathering evidence ({got['evidence_steps']}/{got['window_steps']} steps)"


def too_few_text(got: dict | None) -> str:
    """At the end of a run (the final report, a recording's summary), where more steps will
    never come: 'too few steps for a culprit (19 of the 20 it needs)', else ''."""
    if not got or not got.get("gathering"):
        return ""
    return f"too few steps for a culprit ({got['evidence_steps']} of the {got['window_steps']} it needs)"


RECENT = 20  # steps the live figures are over (a live talk: a change shows within seconds)
_SUMMARIES = Kept(16)


def summarize_cached(steps: list[StepWaits | None], layer_names: list[str],
                     evidence_steps: list[StepWaits] | None = None, per_layer: bool = True) -> dict | None:
    """summarize(steps, layer_names, evidence_steps), kept while they are the same steps: the
    panel, the status line, the headline and the lanes ask for it every frame, and the
    Updater's thread asks first, as soon as a step is complete."""
    ev = evidence_steps if evidence_steps is not None else steps
    key = (tuple(layer_names), len(steps), id(steps[0]) if steps else 0, id(steps[-1]) if steps else 0,
           len(ev), id(ev[0]) if ev else 0, per_layer)
    sources = steps if evidence_steps is None else [*steps, *evidence_steps]  # (compared one by one)
    return _SUMMARIES.get(key, sources, lambda: summarize(steps, layer_names, evidence_steps, per_layer))


def _arrival_culprit(out: dict, steps: list[StepWaits], rank: int, layer_names: list[str]) -> None:
    layers: dict[int, list[float]] = {}
    for s in steps:
        if s.culprit is not None and s.culprit[0] == rank:
            layers.setdefault(s.culprit[1], []).append(s.culprit[2])
    if layers and out["last_arriver_pct"] >= MIN_CULPRIT_STEPS_PCT:
        layer = max(layers, key=lambda k: (len(layers[k]), median(layers[k])))
        out["culprit_layer"] = layer_names[layer] if 0 <= layer < len(layer_names) else str(layer)
        out["culprit"] = culprit_text((rank, layer, median(layers[layer])), layer_names)
        out.update(culprit_rank=rank, culprit_from="arrival")


# a JSON document lists every rank's per-layer excess up to this many ranks (beyond: the
# ranks found slow only)
EXCESS_RANKS_MAX = 16


def evidence(steps: list[StepWaits], layer_names: list[str], window: int = layer_evidence.WINDOW) -> dict | None:
    """The per-layer evidence over these steps (ddptui/model/evidence.py): sliding windows of
    `window` steps, the newest window's verdict, windows that named a culprit, when the
    newest culprit was detected; `steps`: the steps with evidence. Fewer than a window:
    no verdict (`gathering`, no culprit, no findings). None: no step with two or more
    ranks' layers."""
    rows = [(s.step, s.t_ns, s.flat, s.excess) for s in steps if s.ref]
    if not rows:
        return None
    if len(rows) < window:
        return {"window_steps": window, "steps": len(rows), "gathering": True,
                "first_step": rows[0][0], "last_step": rows[-1][0], "windows": 0, "windows_named": 0,
                "windows_named_pct": 0.0, "windows_naming_culprit": 0, "culprit": None, "findings": [],
                "excess_ms": {}, "detected_step": None, "onset_step": None, "detection_steps": None,
                "detection_s": None}
    size = window
    ranks = len(rows[-1][3])
    stride = 1 if ranks <= 64 else size  # many ranks: windows side by side
    got = _scan_cached(rows, size, stride)
    v = got["verdict"]
    show = sorted(v.excess_ms) if len(v.excess_ms) <= EXCESS_RANKS_MAX else sorted({f.rank for f in v.findings})
    c = v.culprit

    def finding(f: layer_evidence.Finding) -> dict:
        kind, layer = f.section
        return {"rank": f.rank, "layer": layer_names[layer] if 0 <= layer < len(layer_names) else str(layer),
                "pass": layer_evidence.PASS_NAMES.get(kind, "?"), "excess_ms": round(f.excess_ms, 3),
                "mad_ms": round(f.mad_ms, 3), "ref_ms": round(f.ref_ms, 3),
                "fast_excess_ms": round(f.fast_excess_ms, 3), "slower_steps": f.slower,
                "of": f.steps, "p": f.p, "text": f.text(layer_names)}
    return {
        "window_steps": size, "steps": len(rows), "gathering": False, "first_step": v.first, "last_step": v.last,
        "windows": got["windows"], "windows_named": got["windows_named"],
        "windows_named_pct": round(100.0 * got["windows_named"] / got["windows"], 1),
        "windows_naming_culprit": got["windows_naming_culprit"],
        "fast_quantile": layer_evidence.FAST_QUANTILE, "tests": v.tests, "need_steps": v.need,
        "min_excess_ms": layer_evidence.MIN_EXCESS_MS, "min_excess_rel": layer_evidence.MIN_EXCESS_REL,
        "culprit": finding(c) if c else None,
        "findings": [finding(f) for f in v.findings[:8]],
        "excess_ms": {str(r): {layer_evidence.section_name(k, layer_names): round(ms, 3)
                               for k, ms in sorted(v.excess_ms.get(r, {}).items())} for r in show},
        "detected_step": got["detected_step"], "onset_step": got["onset_step"],
        "detection_steps": got["detection_steps"], "detection_s": got["detection_s"],
    }


_SCANS = Kept(32)  # the same steps judged again (the report's summary is asked for again and again)


def _scan_cached(rows: list, size: int, stride: int) -> dict:
    key = (len(rows), id(rows[0][2]), id(rows[-1][2]), size, stride)
    return _SCANS.get(key, (rows[0][2], rows[-1][2]), lambda: layer_evidence.scan(rows, size, stride))
