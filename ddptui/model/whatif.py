"""What if: a recorded step replayed under another DDP bucket cap, world size or network.

Pure functions (no I/O, no UI). The input is what a run recorded, read through the Store's
public queries (`span_batches`, `bucket_assignment`, `cap_history`, `recent_figures`, `meta`):

- when each layer's backward ended on every rank (its parameters' gradients are ready then);
- every collective: when it was ready (the spans' issue column), when it ran, its bytes;
- the bucket assignment DDP built (its order is the order gradients became ready).

The step simulator replays one recorded step per rank:

1. buckets: DDP's own rule (torch's `compute_bucket_assignment_by_size`, as its reducer
   rebuilds buckets after the first step): parameters in gradient-ready order (reverse
   definition order for a sequential model), a bucket closes once its bytes reach the limit
   (the parameter that crosses it stays in), limits [first bucket, cap, cap, ...]. The first
   bucket's limit is `_DEFAULT_FIRST_BUCKET_BYTES` (1 MiB) when no cap was given and the cap
   itself when one was (torch's `_BucketCapacityConfig`);
2. a bucket is ready when its last gradient is and the bucket before it was (DDP launches
   buckets in order), plus this rank's measured hand-over delay;
3. collectives run one after another per lane — one NCCL stream, or gloo's two worker
   threads (first free thread, first come first served) — and start once every rank has it
   ready and a free lane; each takes alpha + beta x bytes;
4. the step ends after the last collective (or backward, if later) plus the recorded tail
   (DDP's finalize, the optimizer).

Contention (`Contention`, `fit_contention`): a collective overlapping the backward slows it;
the slowdown per ms overlapped is fitted from each layer's backward with and without an
overlapping collective in the recording, taken out of every recorded backward span and put
back where the plan overlaps it (`contended`). Forward is kept as recorded. A per-call host
cost (`CommFit.call_ms`, 0 unless given or fitted by `fit_calls` from naive runs) is spent on
the issuing thread: it delays the backward after an overlapped call. naive: one blocking
collective per parameter after the backward, with the recorded gap between them;
interleaved: one collective per parameter as its gradient is ready. `synthetic_basis`
describes a step instead of recording it (benchmarks P9c and whatif_scaling).

Collective time alpha + beta x bytes is fitted to the run's own collectives: per collective,
end - the last rank's start (waiting for a late rank is not transfer), through each size's
median. For another world
size N (recorded W), bytes move 2(N-1)/N per rank in a ring: beta scales by
[2(N-1)/N] / [2(W-1)/W] and alpha, the latency of the ring's 2(N-1) steps, by (N-1)/(W-1);
--bus-gbps replaces beta by 2(N-1)/N / bus bandwidth, --hop-us the latency of one ring step. Other ranks are taken to be like the recorded ones (per-rank
batch as recorded: weak scaling).
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from ranks import spec
from ranks.wire import BWD, COLL, COMM, FWD, PASS, STEP

from . import figures
from .columns import layers_marked, whole_passes

MIB = 1024 * 1024
FIRST_BUCKET_BYTES = MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
SKIP_AFTER_CHANGE = 2  # steps after a re-wrap not used: the one-bucket step and the rebuild step
GLOO_THREADS = 2  # ProcessGroupGloo's default worker threads


class WhatIfError(ValueError):
    """Nothing to predict from (one line, for the user)."""


class NotPredicted(WhatIfError):
    """What the recording is cannot be predicted (not: not yet): said as it is."""


# -- DDP's bucketing -----------------------------------------------------------------------
def first_bucket_bytes(cap_mb: float, explicit: bool = True) -> int:
    """The first bucket's limit: 1 MiB with DDP's default cap, the cap itself when given."""
    return int(cap_mb * MIB) if explicit else FIRST_BUCKET_BYTES


def assign_buckets(order: list[int], nbytes: list[int], cap_mb: float,
                   explicit: bool = True) -> list[tuple[int, list[int], int]]:
    """(bucket, [params], bytes) for parameters in gradient-ready `order`: torch's
    compute_bucket_assignment_by_size with limits [first, cap]."""
    limits = [first_bucket_bytes(cap_mb, explicit), int(cap_mb * MIB)]
    out: list[tuple[int, list[int], int]] = []
    cur: list[int] = []
    size = 0
    for p in order:
        cur.append(p)
        size += nbytes[p]
        if size >= limits[min(len(out), 1)]:
            out.append((len(out), cur, size))
            cur, size = [], 0
    if cur:
        out.append((len(out), cur, size))
    return out


def ready_order(assignment: list | None, n_params: int) -> list[int]:
    """Gradient-ready order: the recorded rebuilt bucket assignment's, else reverse definition
    order (what DDP assumes before its first step)."""
    if assignment:
        order = [int(p) for _, ps, _ in sorted(assignment, key=lambda b: b[0]) for p in ps]
        if sorted(order) == list(range(n_params)) and order != list(range(n_params)):
            return order
    return list(reversed(range(n_params)))


# -- the recorded step ---------------------------------------------------------------------
@dataclass
class Coll:
    idx: int
    ready: float  # ms on the step's common axis
    start: float
    end: float


@dataclass
class RankTimeline:
    """One rank's step as the simulation replays it: compute, backward ends and collectives
    (ms from the step's earliest base across ranks)."""
    rank: int
    start: float
    end: float
    compute: list[tuple[float, float]]  # union of forward/backward
    bwd_end: dict[int, float]  # layer -> its backward's end
    colls: list[Coll]  # the gradient AllReduces (COMM): what a plan re-buckets
    # every other collective (COLL: the script's own, FSDP's...): kept where it ran, fixed
    fixed: list[tuple[float, float]] = field(default_factory=list)
    tail_ms: float | None = None  # the tail, when the timeline was moved (`with_calls`, `stretch`)
    bwd_span: dict[int, tuple[float, float]] = field(default_factory=dict)  # layer -> its backward

    def comm_union(self) -> list[tuple[float, float]]:
        return figures.union([(c.start, c.end) for c in self.colls] + self.fixed)

    @property
    def last_compute(self) -> float:
        return max((b for _, b in self.compute), default=self.start)

    @property
    def tail(self) -> float:
        """After the last collective (or backward): finalize and optimizer."""
        if self.tail_ms is not None:
            return self.tail_ms
        last = max([self.last_compute] + [c.end for c in self.colls] + [z for _, z in self.fixed])
        return max(0.0, self.end - last)


def trace_step(batches: dict) -> dict[int, RankTimeline]:
    """rank -> RankTimeline from one strategy step's span batches (rank -> SpanBatch)."""
    origin = min(b.base_ns for b in batches.values())
    out = {}
    for r, b in sorted(batches.items()):
        off = (b.base_ns - origin) / 1e6
        comp, bwd, colls, fixed, spans = [], {}, [], [], {}
        start = end = None
        ci = 0  # (the issue column lists COMM and COLL spans alike)
        for i in range(len(b.kind)):
            k = b.kind[i]
            a, z = off + b.t0[i] / 1e3, off + b.t1[i] / 1e3
            if k == FWD or k == BWD or k == PASS:  # (PASS: a step whose layers were not marked)
                comp.append((a, z))
                if k == BWD:
                    bwd[b.idx[i]] = z
                    spans[b.idx[i]] = (a, z)
            elif k == COMM:
                colls.append(Coll(b.idx[i], off + b.iss[ci] / 1e3, a, z))
                ci += 1
            elif k == COLL:
                fixed.append((a, z))
                ci += 1
            elif k == STEP:
                start, end = a, z
        if start is None:
            continue
        compute = figures.union(comp)
        ws = figures.waits_of(b)  # (where its compute stood waiting for a collective: not compute)
        if ws:
            compute = figures.difference(compute, [(off + a / 1e3, off + z / 1e3) for a, z in ws])
        out[r] = RankTimeline(r, start, end, compute, bwd, colls, fixed, bwd_span=spans)
    return out


# -- collective cost -------------------------------------------------------------------------
def ring_factor(n: int) -> float:
    return 2 * (n - 1) / n if n > 1 else 0.0


@dataclass
class CommFit:
    """Collective time = alpha + beta x bytes, fitted at `world` ranks; plus, apart from it, a
    per-call host cost `call_ms` (the Python call, c10d's bookkeeping, the launch) spent on the
    thread that issues the collective: it delays the compute issued after it (an overlapped
    collective's hook runs on the backward's thread) and the collective's start. It does not
    grow with the world size. 0 unless given or fitted (`fit_calls`: from naive runs, whose
    blocking calls show it): a recording's own collectives measure it inside alpha and their
    backward already holds it."""
    alpha_ms: float
    beta_ms_per_mb: float
    n: int  # collectives fitted
    err_pct: float  # RMS relative error of the fit over them
    world: int
    sizes: int = 0  # distinct sizes seen (alpha is 0 with one)
    call_ms: float = 0.0  # per-call host cost, on the issuing thread
    coll_per_ms: float = 0.0  # contention: collective ms added per ms of compute under it

    @property
    def hop_ms(self) -> float:
        """alpha per ring step: a ring AllReduce takes 2(N-1) steps."""
        return self.alpha_ms / (2 * (max(2, self.world) - 1))

    def ms(self, nbytes: float, world: int | None = None, bus_gbps: float | None = None,
           hop_ms: float | None = None) -> float:
        n = world or self.world
        if n < 2:
            return 0.0
        w = max(2, self.world)
        alpha = 2 * (n - 1) * (self.hop_ms if hop_ms is None else hop_ms)
        if bus_gbps:
            return alpha + nbytes * ring_factor(n) / (bus_gbps * 1e9) * 1e3
        return alpha + self.beta_ms_per_mb * nbytes / MIB * ring_factor(n) / ring_factor(w)

    @property
    def bus_gbps(self) -> float | None:
        """The bus bandwidth beta stands for (nccl-tests' definition)."""
        if self.beta_ms_per_mb <= 0:
            return None
        return MIB * ring_factor(max(2, self.world)) / (self.beta_ms_per_mb / 1e3) / 1e9


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """(alpha, beta, RMS relative error %) minimising the relative error of y = alpha + beta x,
    alpha >= 0."""
    pts = [(x, y) for x, y in zip(xs, ys) if y > 0 and x > 0]
    if not pts:
        raise WhatIfError("no collective with a positive duration to fit")
    w = [1 / (y * y) for _, y in pts]
    sw = sum(w)
    sx = sum(wi * x for wi, (x, _) in zip(w, pts))
    sy = sum(wi * y for wi, (_, y) in zip(w, pts))
    sxx = sum(wi * x * x for wi, (x, _) in zip(w, pts))
    sxy = sum(wi * x * y for wi, (x, y) in zip(w, pts))
    det = sw * sxx - sx * sx
    alpha, beta = 0.0, 0.0
    if len({x for x, _ in pts}) > 1 and det > 0:
        alpha = (sxx * sy - sx * sxy) / det
        beta = (sw * sxy - sx * sy) / det
    if alpha < 0 or beta <= 0 or len({x for x, _ in pts}) < 2:
        alpha, beta = 0.0, sxy / sxx
    err = (sum(((alpha + beta * x - y) / y) ** 2 for x, y in pts) / len(pts)) ** 0.5
    return alpha, beta, 100.0 * err


def _solve(rows: list[list[float]], ys: list[float]) -> list[float] | None:
    """Least squares of relative error (weights 1/y^2) by the normal equations; None if singular."""
    k = len(rows[0])
    a = [[sum(r[i] * r[j] / (y * y) for r, y in zip(rows, ys)) for j in range(k)] for i in range(k)]
    b = [sum(r[i] * y / (y * y) for r, y in zip(rows, ys)) for i in range(k)]
    for c in range(k):  # Gauss-Jordan, partial pivoting
        piv = max(range(c, k), key=lambda i: abs(a[i][c]))
        if abs(a[piv][c]) < 1e-18:
            return None
        a[c], a[piv], b[c], b[piv] = a[piv], a[c], b[piv], b[c]
        for i in range(k):
            if i != c:
                f = a[i][c] / a[c][c]
                a[i] = [x - f * y for x, y in zip(a[i], a[c])]
                b[i] -= f * b[c]
    return [b[i] / a[i][i] for i in range(k)]


def fit_calls(runs: list[tuple[int, float, int, float]], world: int = 2) -> CommFit:
    """The collective cost from blocking runs' totals (naive DP: one blocking AllReduce per
    parameter tensor, after the backward): runs = [(calls per step, gradient bytes per step,
    world size, measured communication ms per step)], fitted as
    calls x (call + 2(N-1) x hop) + bytes x 2(N-1)/N x beta' (relative least squares, each
    term >= 0). Returns a CommFit at `world` ranks: call_ms the per-call host cost, alpha the
    ring's latency 2(W-1) x hop, beta = beta' x 2(W-1)/W."""
    if not runs:
        raise WhatIfError("no naive run to fit the per-call cost to")
    cols = [lambda c, b, n: c, lambda c, b, n: c * 2 * (n - 1), lambda c, b, n: b / MIB * ring_factor(n)]
    ys = [ms for *_, ms in runs]
    if any(y <= 0 for y in ys):
        raise WhatIfError("a naive run without communication time")
    use = [0, 1, 2]
    while True:  # drop a term fitted negative (no ring latency when every run has one world size)
        rows = [[cols[i](c, b, n) for i in use] for c, b, n, _ in runs]
        sol = _solve(rows, ys) if len(runs) >= len(use) else None
        if sol is not None and min(sol) >= 0:
            break
        if len(use) == 1:
            sol = [max(0.0, sol[0]) if sol else 0.0]
            break
        drop = use[sol.index(min(sol))] if sol is not None else use[1 if 1 in use else -1]
        use = [i for i in use if i != drop]
    coef = dict(zip(use, sol))
    call, hop, bp = coef.get(0, 0.0), coef.get(1, 0.0), coef.get(2, 0.0)
    pred = [call * c + hop * c * 2 * (n - 1) + bp * b / MIB * ring_factor(n) for c, b, n, _ in runs]
    err = (sum(((p - y) / y) ** 2 for p, y in zip(pred, ys)) / len(ys)) ** 0.5
    return CommFit(2 * (max(2, world) - 1) * hop, bp * ring_factor(max(2, world)), sum(c for c, *_ in runs),
                   100.0 * err, world, len({round(b) for _, b, _, _ in runs}), call)


# -- what predictions are made from ----------------------------------------------------------
@dataclass
class Basis:
    """The recorded steps of one strategy that predictions are made from."""
    strategy: str
    world: int
    lanes: int  # collectives that run at once per rank (NCCL 1, gloo 2)
    backend: str
    param_bytes: list[int]
    param_layer: list[int]
    cap_mb: float | None  # DDP: the cap these steps ran under
    explicit: bool  # DDP: the cap was given (else DDP's default, first bucket 1 MiB)
    assignment: list | None  # DDP: the recorded bucket assignment of these steps
    steps: list[int]
    traces: list[dict[int, RankTimeline]]
    bytes_of: list[dict[int, int]]  # per step: collective idx -> bytes
    # steps not replayed that show the same layers' backward without an overlapping collective
    # (the same strategy and cap right after a re-wrap, naive's): the contention fit's reference
    reference: list[dict[int, RankTimeline]] = field(default_factory=list)
    ref_bytes_of: list[dict[int, int]] = field(default_factory=list)
    ranks: list[int] | None = None  # the ranks replayed where not all were (replay_ranks)

    @property
    def order(self) -> list[int]:
        return ready_order(self.assignment, len(self.param_bytes))


def synthetic_basis(params: list[tuple[int, int]], bytes_per: int, compute_ms: float,
                    strategy: str = "ddp", world: int = 2, overhead_ms: float = 0.0,
                    cap_mb: float = spec.DEFAULT_BUCKET_CAP_MB, explicit: bool = False,
                    lanes: int = 1, backend: str = "nccl") -> Basis:
    """A step described rather than recorded: [(numel, layer)] per parameter tensor in
    definition order, `compute_ms` of forward (1/3) and backward (2/3) spread over the layers
    in proportion to their parameters, then `overhead_ms` of step overhead that overlaps
    nothing (the launch-bound work a data-parallel step adds: batch slicing, gradient
    scaling, the optimizer's launches), on one rank standing for all."""
    layers = max(layer for _, layer in params) + 1
    per_layer = [0] * layers
    for n, layer in params:
        per_layer[layer] += n
    total = sum(per_layer) or 1
    fwd, bwd = compute_ms / 3, 2 * compute_ms / 3
    t, bwd_end, spans = fwd, {}, {}
    for layer in reversed(range(layers)):
        spans[layer] = (t, t + bwd * per_layer[layer] / total)
        t = bwd_end[layer] = spans[layer][1]
    tr = {0: RankTimeline(0, 0.0, t + max(0.0, overhead_ms), [(0.0, t)], bwd_end, [], bwd_span=spans)}
    return Basis(strategy, world, lanes, backend, [n * bytes_per for n, _ in params],
                 [layer for _, layer in params], cap_mb if strategy == "ddp" else None, explicit,
                 None, [0], [tr], [{}])


def ddp_modules(assignment) -> list[tuple[int, int]]:
    """The DDP modules a bucket assignment holds, as (first, last) bucket index: a rank's
    second DDP module numbers its buckets from its first parameter's index (ranks.scripts.commhook
    CommState.offset), so a gap in the indices starts a module (one bucket a parameter in
    every module but the last would hide it: then one)."""
    idx = sorted({int(b[0]) for b in assignment})
    out: list[tuple[int, int]] = []
    for i in idx:
        if out and i == out[-1][1] + 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def _explicit_at(store, step: int) -> bool:
    if any(k <= step for k, _ in store.cap_history()):
        return True
    cap = store.cap_at(step)  # (a script's own DDP(bucket_cap_mb=...): no setting says so)
    if cap is not None and cap != spec.DEFAULT_BUCKET_CAP_MB:
        return True
    settings = store.meta.settings
    return settings.get("bucket_cap_mb") is not None


def layered_steps(batches: dict, ks: list[int], last: int | None = None) -> list[int]:
    """Of the steps `ks` (the last `last` of them), those whose layers were marked (a backward
    per layer; the ranks mark the same steps: the first rank's tells), where any are: a step
    marked as whole passes (layer marks on a sample of steps) has no layer to re-bucket or
    slow down. Looked for from the newest back (at 1,024 ranks this runs at every refresh)."""
    got = []
    for k in reversed(ks):
        if layers_marked(next(iter(batches[k].values()))):
            got.append(k)
            if last is not None and len(got) >= last:
                break
    got.reverse()
    if got or not any(whole_passes(next(iter(batches[k].values()))) for k in ks):
        return got or (ks[-last:] if last else ks)
    return []  # (only steps marked as whole passes)


def replay_ranks(steps: list[dict], n: int) -> list[int]:
    """n of the steps' ranks to replay (each step: rank -> span batch; many ranks): in each
    step the n // 32 that were ready for their last collective last (the ones the others wait
    for: a collective ends after the last rank is ready), up to n // 2 in all, and the others
    evenly spread over the rest (each rank's step is its own: the figures are medians over
    ranks, which the spread keeps), sorted."""
    late: dict[int, None] = {}
    for step in steps:
        def ready(r: int, step=step) -> int:
            b = step[r]
            return b.base_ns + (b.iss[-1] * 1000 if len(b.iss) else (max(b.t1) * 1000 if len(b.t1) else 0))
        for r in sorted(step, key=ready, reverse=True)[:max(1, n // 32)]:
            if len(late) < max(1, n // 2):
                late[r] = None
    ranks = set().union(*(set(s) for s in steps)) if steps else set()
    if len(ranks) <= n:
        return sorted(ranks)
    rest = sorted(ranks - set(late))
    spread = [rest[i * len(rest) // (n - len(late))] for i in range(n - len(late))] if rest else []
    return sorted(set(late) | set(spread))


def collect(store, strategy: str = "ddp", cap_mb: float | None = None, upto: int | None = None,
            last: int | None = None, reference_last: int | None = None,
            max_ranks: int | None = None) -> Basis:
    """The kept, complete steps of `strategy` (DDP: those run under `cap_mb`, default the
    cap in force at `upto`), less warm-up and the steps right after a re-wrap; the last
    `last` of them replayed, and as the contention fit's reference every other kept step of
    it and of naive (the last `reference_last` of each, where given: with many ranks each
    step is a timeline per rank to build). `max_ranks`: with more ranks than that, that many
    replayed (replay_ranks of the steps replayed: the ranks last ready in any of them and a
    spread of the others; `Basis.ranks` says which); the collectives' cost stays that of
    every rank."""
    if strategy == "fsdp":
        raise WhatIfError("fsdp: no gradient AllReduce to re-bucket or re-size (its all-gathers and "
                          "reduce-scatters are kept as recorded); predict from ddp or naive steps")
    params = store.meta.params
    if not params:
        raise WhatIfError("the recording has no parameter table")
    pbytes = spec.grad_bytes(params)
    player = [int(p[2]) if len(p) > 2 else 0 for p in params]
    batches = store.span_batches().get(strategy) or {}
    want = spec.strategy_ranks(strategy, store.world)
    ks = sorted(k for k, rs in batches.items() if len(rs) >= want and k > 0 and (upto is None or k <= upto))
    if not ks:
        raise WhatIfError(f"no complete {strategy} step after the first to predict from")
    changes = store.cap_history()
    since = lambda k: max((c for c, _ in changes if c <= k), default=None)  # noqa: E731
    # DDP wraps at its first step too: that step and the rebuild after it are not steady
    ok = lambda k: k >= (SKIP_AFTER_CHANGE if since(k) is None else since(k) + SKIP_AFTER_CHANGE)  # noqa: E731
    cap = explicit = None
    if strategy == "ddp":
        if cap_mb is None:
            cap_mb = store.cap_at(ks[-1])
        cap_mb = float(cap_mb if cap_mb is not None else spec.DEFAULT_BUCKET_CAP_MB)
        ks = [k for k in ks if ok(k) and (store.cap_at(k) or spec.DEFAULT_BUCKET_CAP_MB) == cap_mb]
        if not ks:
            raise WhatIfError(f"no kept ddp step ran with bucket_cap_mb {cap_mb:g} "
                              f"(caps in the recording: {caps_text(store)})")
        cap, explicit = cap_mb, _explicit_at(store, ks[-1])
        modules = ddp_modules(store.bucket_assignment("ddp", ks[-1]) or [])
        if len(modules) > 1:
            raise NotPredicted(f"the script wraps {len(modules)} modules in DDP (buckets "
                              + ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in modules)
                              + "); what-if re-buckets one DDP module's gradients, so it predicts none here")
    ks = layered_steps(batches, ks, last or None)
    if not ks:
        raise WhatIfError(f"no kept {strategy} step has its layers marked yet (layers are marked on a "
                          "sample of steps: short steps)")
    backend = str(store.meta.backend or next((i.backend for i in store.rank_snapshot().values()), "") or "")
    lanes = 1 if "nccl" in backend.lower() else GLOO_THREADS
    keep = None
    if max_ranks and len(batches[ks[-1]]) > max_ranks:  # (the ranks ready last in any step replayed)
        keep = set(replay_ranks([batches[k] for k in ks], max_ranks))
        want = len(keep)

    def trace(rs: dict) -> dict[int, RankTimeline]:
        return trace_step(rs if keep is None else {r: b for r, b in rs.items() if r in keep})
    traces, bytes_of, assignment = [], [], None
    for k in ks:
        tr = trace(batches[k])
        if len(tr) < want:
            continue
        if strategy == "ddp":
            assignment = store.bucket_assignment("ddp", k) or assignment
            sizes = {int(b): int(nb) for b, _, nb in (store.bucket_assignment("ddp", k) or [])}
            bytes_of.append(sizes)
        else:
            bytes_of.append({i: b for i, b in enumerate(pbytes)})
        traces.append(tr)
    if not traces:
        raise WhatIfError(f"no complete {strategy} step to predict from")
    # the reference: steps after the first not replayed, of this strategy at this cap, and naive's
    basis = Basis(strategy, store.world, lanes, backend, pbytes, player, cap, bool(explicit),
                  assignment, ks, traces, bytes_of, ranks=sorted(keep) if keep is not None else None)
    used = set(ks)
    for s, bs in store.span_batches().items():
        if s not in (strategy, "naive"):
            continue
        cand = [k for k in sorted(bs) if not (k < 1 or (s == strategy and k in used) or len(bs[k]) < want
                                              or (upto is not None and k > upto))]
        if s == "ddp":
            cand = [k for k in cand if (store.cap_at(k) or spec.DEFAULT_BUCKET_CAP_MB) == cap_mb]
        cand = layered_steps(bs, cand, reference_last)
        for k in cand:
            rs = bs[k]
            tr = trace(rs)
            if len(tr) < want:
                continue
            basis.reference.append(tr)
            if s == "ddp":
                basis.ref_bytes_of.append({int(b): int(nb) for b, _, nb in (store.bucket_assignment("ddp", k) or [])})
            else:
                basis.ref_bytes_of.append({})  # (naive's blocking calls: not in the collective fit)
    return basis


def caps_text(store) -> str:
    caps = [store.meta.bucket_cap_mb or spec.DEFAULT_BUCKET_CAP_MB] + [c for _, c in store.cap_history()]
    seen: list[float] = []
    for c in caps:
        if c not in seen:
            seen.append(c)
    return ", ".join(f"{c:g} MB" for c in seen)


def _matched(tr: dict[int, RankTimeline]):
    """The step's collectives matched across ranks by (idx, nth): [(idx, {rank: Coll})]."""
    per: dict[tuple[int, int], dict[int, Coll]] = {}
    order: list[tuple[int, int]] = []
    for r, t in tr.items():
        seen: dict[int, int] = {}
        for c in t.colls:
            n = seen.get(c.idx, 0)
            seen[c.idx] = n + 1
            key = (c.idx, n)
            if key not in per:
                per[key] = {}
                order.append(key)
            per[key][r] = c
    return [(key[0], per[key]) for key in order if len(per[key]) == len(tr)]


def _coll_points(basis: Basis, reference: bool = False):
    """(MB, ms, ms of compute overlapping it) per matched collective: end - the last rank's
    start, and the median over ranks of the compute inside that interval."""
    out = []
    pairs = zip(basis.reference, basis.ref_bytes_of) if reference else zip(basis.traces, basis.bytes_of)
    for tr, sizes in pairs:
        if len(tr) < 2:
            continue
        for idx, cs in _matched(tr):
            nb = sizes.get(idx)
            if not nb:
                continue
            s = max(c.start for c in cs.values())
            out.append((nb / MIB, statistics.median(c.end - s for c in cs.values()),
                        statistics.median(figures.intersection_length(tr[r].compute, [(s, c.end)])
                                          for r, c in cs.items())))
    return out


def _median_line(pts: list[tuple[float, float]]) -> tuple[float, float]:
    """(alpha, beta): the line through each size's median."""
    by: dict[float, list[float]] = {}
    for x, y in pts:
        by.setdefault(round(x, 6), []).append(y)
    a, b, _ = fit_line(list(by), [statistics.median(v) for v in by.values()])
    return a, b


def fit_comm(basis: Basis, contention: bool = False) -> CommFit:
    """alpha + beta x bytes from the basis' collectives: end - the last rank's start; fitted
    through each size's median (the relative-error weights would otherwise pull a noisy
    size's line down to its fastest calls: a 26 MB bucket timed 20 to 120 ms on two loaded
    cores fitted at 25 ms); the error printed is over every collective. With `contention`:
    alpha and beta from the collectives no compute overlapped (at most OFF_FRAC of their time;
    the basis' and its reference steps', two sizes at least), and coll_per_ms — the median over the others (compute under
    a quarter of them at least) of the ms beyond that line per ms of compute under them."""
    pts = _coll_points(basis)
    if not pts:
        raise WhatIfError(f"no collective between two or more ranks in the {basis.strategy} steps "
                          "to fit alpha and beta to")
    k = 0.0
    if contention:
        allp = [p for p in pts + _coll_points(basis, reference=True) if p[1] > 0]
        off = [(x, y) for x, y, ov in allp if ov <= OFF_FRAC * y]
        on = [(x, y, ov) for x, y, ov in allp if ov >= 0.25 * y]
        if len({round(x, 6) for x, _ in off}) >= 2 and len(on) >= 3:
            a, b = _median_line(off)
            k = min(max(0.0, statistics.median((y - (a + b * x)) / ov for x, y, ov in on)), K_MAX)
    if not k:
        a, b = _median_line([(x, y) for x, y, _ in pts])
    err = (sum(((a + b * x + k * ov - y) / y) ** 2 for x, y, ov in pts if y > 0) / len(pts)) ** 0.5
    fit = CommFit(a, b, len(pts), 100.0 * err, basis.world, len({round(x, 6) for x, _, _ in pts}))
    fit.coll_per_ms = k
    return fit


# -- contention -------------------------------------------------------------------------------
@dataclass
class Contention:
    """How much a collective slows the backward it overlaps (the ranks' cores, or a GPU's SMs,
    shared), fitted from the recording itself: bwd_per_ms, backward ms added per ms a
    collective overlaps it — each layer's backward spans with an overlapping collective against
    the same layer's without one (in the steps replayed, else in the reference steps: the same
    strategy and cap right after a re-wrap, naive's), the latter scaled by the drift of the
    layers overlapped in neither.

    The simulator first takes out of each recorded backward span the slowdown its recorded
    overlap caused, then adds back the slowdown of the overlap the plan gives it. The other
    way, compute slowing a collective, is the CommFit's coll_per_ms (`fit_comm(contention=True)`)."""
    bwd_per_ms: float = 0.0
    layers: int = 0  # layers seen both with and without an overlapping collective
    with_spans: int = 0
    without_spans: int = 0
    note: str = ""

    @property
    def on(self) -> bool:
        return self.bwd_per_ms > 0


K_MAX = 0.9  # a contention slope beyond this is taken as noise
# a collective with at most this share of its time under compute counts as one with none (a
# recorded span's edges touch the compute around it: 0.1 ms under a 10 ms collective is not
# contention, and taking only exact zeros left real recordings with one size, no fit)
OFF_FRAC = 0.05


def _layer_spans(traces) -> tuple[dict[int, list[tuple[float, float]]], dict[int, list[float]]]:
    """layer -> [(duration, overlapped ms)] with an overlapping collective, and [duration] without."""
    on: dict[int, list[tuple[float, float]]] = {}
    off: dict[int, list[float]] = {}
    for tr in traces:
        for t in tr.values():
            mu = t.comm_union()
            for layer, (a, z) in t.bwd_span.items():
                ov = figures.intersection_length([(a, z)], mu)
                if ov > 0:
                    on.setdefault(layer, []).append((z - a, ov))
                else:
                    off.setdefault(layer, []).append(z - a)
    return on, off


def fit_contention(basis: Basis, fit: CommFit | None = None) -> Contention:  # (fit: unused, kept for callers)
    """The backward's slowdown per ms a collective overlaps it (see Contention)."""
    med = statistics.median
    on, off = _layer_spans(basis.traces)
    _, ref = _layer_spans(basis.reference)
    # the drift between the reference steps and the replayed ones: layers overlapped in neither
    ratios = [med(off[layer]) / med(ref[layer]) for layer in off
              if layer not in on and len(off[layer]) >= 3 and ref.get(layer) and med(ref[layer]) > 0]
    drift = med(ratios) if ratios else 1.0
    num = den = 0.0
    layers = n_on = n_off = 0
    for layer, pairs in on.items():
        pairs = [(d, ov) for d, ov in pairs if ov >= 0.25 * d]  # overlapped for a good part of it
        if len(pairs) < 3:
            continue
        if len(off.get(layer, [])) >= 3:
            base, n = med(off[layer]), len(off[layer])
        elif ref.get(layer):
            base, n = drift * med(ref[layer]), len(ref[layer])
        else:
            continue
        num += med(d for d, _ in pairs) - base
        den += med(ov for _, ov in pairs)
        layers, n_on, n_off = layers + 1, n_on + len(pairs), n_off + n
    k = min(max(0.0, num / den), K_MAX) if den > 0 else 0.0
    note = ("" if layers else "no layer's backward seen both with and without an overlapping collective: "
            "no slowdown of compute modelled")
    return Contention(k, layers, n_on, n_off, note)


def _shift_fn(t: RankTimeline, durs: dict[int, float]):
    """x -> x moved by the change of every layer's backward to `durs` before it (in proportion
    inside a span)."""
    moves = [(a, z, durs[layer] - (z - a)) for layer, (a, z) in t.bwd_span.items() if layer in durs]

    def sh(x: float) -> float:
        d = 0.0
        for a, z, dv in moves:
            if x >= z:
                d += dv
            elif x > a:
                d += dv * (x - a) / (z - a)
        return x + d
    return sh


def stretch(t: RankTimeline, durs: dict[int, float]) -> RankTimeline:
    """The rank's step with each layer's backward lasting `durs[layer]` ms, what follows it moved."""
    sh = _shift_fn(t, durs)
    return RankTimeline(t.rank, t.start, sh(t.end), [(sh(a), sh(z)) for a, z in t.compute],
                        {k: sh(v) for k, v in t.bwd_end.items()},
                        [Coll(c.idx, sh(c.ready), sh(c.start), sh(c.end)) for c in t.colls],
                        [(sh(a), sh(z)) for a, z in t.fixed], t.tail,
                        {k: (sh(a), sh(z)) for k, (a, z) in t.bwd_span.items()})


def bare_backward(t: RankTimeline, k: float) -> dict[int, float]:
    """Each layer's backward less the slowdown its recorded overlap caused."""
    mu = t.comm_union()
    return {layer: max(0.0, (z - a) - k * figures.intersection_length([(a, z)], mu))
            for layer, (a, z) in t.bwd_span.items()}


# -- the simulator ---------------------------------------------------------------------------
@dataclass
class Delays:
    """Per rank, what a collective waits for besides its gradients (ms, medians)."""
    ready: dict[int, float]  # DDP/interleaved: ready - last gradient; naive: first ready - backward end
    gap: dict[int, float]  # naive: ready of the next - end of the previous


def fit_delays(basis: Basis) -> Delays:
    ready: dict[int, list[float]] = {}
    gap: dict[int, list[float]] = {}
    bucket_params = {int(b): [int(p) for p in ps] for b, ps, _ in (basis.assignment or [])}
    for tr in basis.traces:
        for r, t in tr.items():
            if basis.strategy == "naive":
                if t.colls:
                    ready.setdefault(r, []).append(t.colls[0].ready - t.last_compute)
                for a, b in zip(t.colls, t.colls[1:]):
                    gap.setdefault(r, []).append(max(0.0, b.ready - a.end))
                continue
            for c in t.colls:
                ps = bucket_params.get(c.idx, []) if basis.strategy == "ddp" else [c.idx]
                ends = [t.bwd_end.get(basis.param_layer[p]) for p in ps if p < len(basis.param_layer)]
                ends = [e for e in ends if e is not None]
                if ends:
                    ready.setdefault(r, []).append(c.ready - max(ends))
    med = lambda d: {r: statistics.median(v) for r, v in d.items() if v}  # noqa: E731
    return Delays(med(ready), med(gap))


@dataclass
class SimRank:
    step_ms: float
    comm: list[tuple[float, float]]
    exposed_ms: float
    comm_ms: float


def _issue_times(t: RankTimeline, colls, delays: Delays, param_layer: list[int], r: int) -> list[float]:
    """When each collective of a plan is issued on this rank's recorded axis (non-blocking)."""
    out, prev = [], float("-inf")
    for params, _ in colls:
        ends = [t.bwd_end.get(param_layer[p], t.last_compute) for p in params or []]
        prev = max(prev, (max(ends) if ends else t.last_compute) + delays.ready.get(r, 0.0))
        out.append(prev)
    return out


def with_calls(t: RankTimeline, issued: list[float], call_ms: float) -> RankTimeline:
    """The rank's step with a host cost of `call_ms` per collective issued at `issued`: every
    point after an issue moves by call_ms, less the recorded collectives' own (already in it)."""
    old = sorted(c.ready for c in t.colls)
    new = sorted(issued)

    def sh(x: float) -> float:
        return x + call_ms * (sum(1 for v in new if v < x) - sum(1 for v in old if v < x))
    return RankTimeline(t.rank, t.start, sh(t.end), [(sh(a), sh(z)) for a, z in t.compute],
                        {k: sh(v) for k, v in t.bwd_end.items()}, t.colls,
                        [(sh(a), sh(z)) for a, z in t.fixed], t.tail,
                        {k: (sh(a), sh(z)) for k, (a, z) in t.bwd_span.items()})


def simulate(tr: dict[int, RankTimeline], colls: list[tuple[list[int] | None, int]], cost, lanes: int,
             delays: Delays, param_layer: list[int], blocking: bool = False,
             call_ms: float = 0.0, coll_per_ms: float = 0.0) -> dict[int, SimRank]:
    """One step under a plan of collectives: [(params it carries (None: after the backward),
    bytes)] in launch order; cost(bytes) -> ms on the lane; call_ms the per-call host cost
    (blocking: before each call, on the same thread; else: on the thread that issues it, so
    the compute after it is delayed, and the collective is ready after it)."""
    if call_ms and not blocking:
        tr = {r: with_calls(t, _issue_times(t, colls, delays, param_layer, r), call_ms) for r, t in tr.items()}
    free = {r: [0.0] * max(1, lanes) for r in tr}
    host = {r: float("-inf") for r in tr}
    prev_ready = {r: float("-inf") for r in tr}
    prev_end = {r: None for r in tr}
    spans: dict[int, list[tuple[float, float]]] = {r: [] for r in tr}
    for params, nb in colls:
        local = {}
        for r, t in tr.items():
            if blocking:
                pe = prev_end[r]
                ready = (t.last_compute + delays.ready.get(r, 0.0) if pe is None
                         else pe + delays.gap.get(r, 0.0)) + call_ms
            else:
                ends = [t.bwd_end.get(param_layer[p], t.last_compute) for p in params or []]
                ready = max([prev_ready[r], (max(ends) if ends else t.last_compute) + delays.ready.get(r, 0.0)])
                prev_ready[r] = ready
                if call_ms:  # the issuing thread makes one call after another
                    ready = host[r] = max(ready, host[r]) + call_ms
            lane = min(range(len(free[r])), key=lambda i: free[r][i])
            local[r] = (max(ready, free[r][lane]), lane)
        s = max(v[0] for v in local.values())
        e = s + cost(nb)
        for _ in range(2 if coll_per_ms else 0):  # slowed by the compute under it
            ov = statistics.median(figures.intersection_length(tr[r].compute, [(s, e)]) for r in local)
            e = s + cost(nb) + coll_per_ms * ov
        for r, (ls, lane) in local.items():
            free[r][lane] = e
            prev_end[r] = e
            spans[r].append((ls, e))
    out = {}
    for r, t in tr.items():
        last = max([t.last_compute] + [e for _, e in spans[r]] + [z for _, z in t.fixed])
        mu = figures.union(spans[r] + t.fixed)  # (COLL spans: fixed communication, as recorded)
        comm = figures.length(mu)
        exposed = comm - figures.intersection_length(t.compute, mu)
        out[r] = SimRank(last + t.tail - t.start, spans[r], exposed, comm)
    return out


def plan(basis: Basis, cap_mb: float | None = None, explicit: bool = True) -> list[tuple[list[int] | None, int]]:
    """The collectives of a step in launch order: DDP's buckets at a cap, one per parameter
    otherwise."""
    if basis.strategy == "ddp":
        cap = cap_mb if cap_mb is not None else basis.cap_mb
        return [(ps, nb) for _, ps, nb in assign_buckets(basis.order, basis.param_bytes, cap, explicit)]
    if basis.strategy == "naive":
        return [([p], basis.param_bytes[p]) for p in range(len(basis.param_bytes))]
    return [([p], basis.param_bytes[p]) for p in basis.order]


@dataclass
class Prediction:
    strategy: str
    world: int
    cap_mb: float | None
    bus_gbps: float | None
    collectives: int
    step_ms: float
    comm_ms: float
    exposed_ms: float
    overlap_pct: float | None
    no_comm_step_ms: float  # the same steps with instant collectives
    efficiency_pct: float | None  # no_comm_step / step
    measured: dict | None = None  # figures measured in the recording under the same settings
    kind: str = "prediction"

    def as_dict(self) -> dict:
        return asdict(self)


ROUNDS = 4  # the contended step: simulate, re-time the backward by its new overlap, again


def contended(tr: dict[int, RankTimeline], colls, cost, basis: Basis, delays: Delays, blocking: bool,
              call_ms: float, cont: Contention, coll_per_ms: float = 0.0):
    """(the simulated ranks, the bare timelines) of one step under contention: each layer's
    backward without the slowdown its recorded overlap caused, plus bwd_per_ms x the overlap the
    plan gives it (a fixed point, ROUNDS rounds)."""
    kb = cont.bwd_per_ms
    bare = {r: bare_backward(t, kb) for r, t in tr.items()}
    base = {r: stretch(t, bare[r]) for r, t in tr.items()}
    cur = base
    sim = None
    for _ in range(ROUNDS):
        sim = simulate(cur, colls, cost, basis.lanes, delays, basis.param_layer, blocking, call_ms,
                       coll_per_ms)
        nxt = {}
        for r, t in cur.items():
            mu = figures.union(sim[r].comm + t.fixed)
            durs = {layer: bare[r][layer] + kb * figures.intersection_length([sp], mu)
                    for layer, sp in t.bwd_span.items()}
            nxt[r] = stretch(base[r], durs)
        cur = nxt
    return sim, base


def predict(basis: Basis, fit: CommFit, cap_mb: float | None = None, world: int | None = None,
            bus_gbps: float | None = None, explicit: bool | None = None,
            delays: Delays | None = None, hop_ms: float | None = None,
            contention: Contention | None = None) -> Prediction:
    """Median over the basis' steps of the simulated step under these settings; with
    `contention`, compute and collectives slowed where the plan overlaps them."""
    if explicit is None:  # the basis' own cap keeps its first-bucket rule; another is given
        explicit = basis.explicit if (cap_mb is None or cap_mb == basis.cap_mb) else True
    delays = delays or fit_delays(basis)
    n = world or basis.world
    colls = plan(basis, cap_mb, explicit) if basis.strategy != "single" else []
    blocking = basis.strategy == "naive"
    steps, comms, exps, bare = [], [], [], []
    cost = lambda nb: fit.ms(nb, n, bus_gbps, hop_ms)  # noqa: E731
    for tr in basis.traces:
        if contention is not None and (contention.on or fit.coll_per_ms):
            sim, tr = contended(tr, colls, cost, basis, delays, blocking, fit.call_ms, contention,
                                fit.coll_per_ms)
        else:
            sim = simulate(tr, colls, cost, basis.lanes, delays, basis.param_layer, blocking, fit.call_ms)
        zero = simulate(tr, colls, lambda nb: 0.0, basis.lanes, delays, basis.param_layer, blocking)
        steps.append(max(s.step_ms for s in sim.values()))
        comms.append(statistics.mean(s.comm_ms for s in sim.values()))
        exps.append(statistics.mean(s.exposed_ms for s in sim.values()))
        bare.append(max(s.step_ms for s in zero.values()))
    med = statistics.median
    step, comm, exp, nc = med(steps), med(comms), med(exps), med(bare)
    if n < 2:
        comm = exp = 0.0
    return Prediction(basis.strategy, n, cap_mb if cap_mb is not None else basis.cap_mb, bus_gbps,
                      len(colls), step, comm, exp, figures.overlap_pct(comm, exp), nc,
                      100.0 * nc / step if step > 0 else None)


def measured(store, strategy: str, cap_mb: float | None = None, since: int = 0,
             upto: int | None = None) -> dict | None:
    """Median figures of the kept steps since..upto a recording ran under a cap (DDP) or at
    all, less warm-up and the steps right after a re-wrap; None when there are none."""
    figs = store.recent_figures(strategy, upto=upto, n=1_000_000, since=since)
    changes = store.cap_history()
    use = []
    for f in figs:
        if f.step == 0:
            continue
        if strategy == "ddp":
            since = max((c for c, _ in changes if c <= f.step), default=0)
            if f.step < since + SKIP_AFTER_CHANGE:
                continue
            if cap_mb is not None and (store.cap_at(f.step) or spec.DEFAULT_BUCKET_CAP_MB) != cap_mb:
                continue
        use.append(f)
    if not use:
        return None
    med = lambda name: statistics.median(getattr(f, name) for f in use)  # noqa: E731
    comm, exp = med("comm_ms"), med("exposed_ms")
    return {"steps": len(use), "step_ms": med("step_ms"), "comm_ms": comm, "exposed_ms": exp,
            "overlap_pct": figures.overlap_pct(comm, exp), "first_step": use[0].step, "last_step": use[-1].step}


@dataclass
class Report:
    """Everything `ddptui whatif` prints: the basis, the fit and the predictions."""
    basis: dict
    fit: dict
    caps: list[Prediction] = field(default_factory=list)
    worlds: list[Prediction] = field(default_factory=list)
    note: str = ""

    def as_dict(self) -> dict:
        return {"kind": "prediction", "basis": self.basis, "fit": self.fit,
                "bucket_caps": [p.as_dict() for p in self.caps],
                "world_sizes": [p.as_dict() for p in self.worlds], "note": self.note}


UNCHECKED = ("world-size and bandwidth predictions are unchecked against measurement until a "
             "GPU run checks them")


def basis_info(b: Basis, fit: CommFit, cont: Contention | None = None) -> tuple[dict, dict]:
    info = {"strategy": b.strategy, "world": b.world, "backend": b.backend, "lanes": b.lanes,
            "steps": len(b.steps), "first_step": b.steps[0], "last_step": b.steps[-1],
            "cap_mb": b.cap_mb, "cap_explicit": b.explicit if b.strategy == "ddp" else None,
            "buckets": len(b.assignment) if b.assignment else None,
            "ranks_replayed": len(b.ranks) if b.ranks is not None else b.world}
    fitd = {"alpha_ms": fit.alpha_ms, "beta_ms_per_mb": fit.beta_ms_per_mb, "collectives": fit.n,
            "sizes": fit.sizes, "err_pct": fit.err_pct, "world": fit.world, "bus_gbps": fit.bus_gbps,
            "hop_ms": fit.hop_ms, "call_ms": fit.call_ms, "coll_per_ms": fit.coll_per_ms,
            "contention": asdict(cont) if cont is not None else None}
    return info, fitd


def with_call_cost(fit: CommFit, call_ms: float | None) -> CommFit:
    """The fit with a per-call host cost given (e.g. P9c's, from naive runs): taken out of
    alpha (the recorded collectives held it), up to all of it."""
    if not call_ms:
        return fit
    out = CommFit(**asdict(fit))
    out.call_ms = call_ms
    out.alpha_ms = max(0.0, fit.alpha_ms - call_ms)
    return out


def whatif(store, caps: list[float] | None = None, worlds: list[int] | None = None,
           bus_gbps: float | None = None, strategy: str | None = None,
           from_cap: float | None = None, hop_us: float | None = None,
           call_us: float | None = None, contention: bool = True) -> Report:
    """The predictions of `ddptui whatif`: DDP at each bucket cap (its basis: the steps run
    under `from_cap`, default the cap in force last), and every communicating strategy at each
    world size (at its recorded cap) — with the figures measured under the same settings."""
    # (fsdp: no gradient AllReduce to re-bucket; its collectives are fixed communication)
    strategies = [strategy] if strategy else [s for s in store.strategies() if s not in ("single", "fsdp")]
    if not strategies:
        if "fsdp" in store.strategies():
            raise NotPredicted("fsdp: no gradient AllReduce to re-bucket or re-size (its all-gathers and "
                               "reduce-scatters are kept as recorded); what-if predicts from ddp, "
                               "naive or interleaved steps")
        raise WhatIfError("the recording has no strategy that communicates")
    bases = {}
    for s in strategies:
        try:
            bases[s] = collect(store, s, cap_mb=from_cap if s == "ddp" else None)
        except WhatIfError:
            if strategy or (caps and s == "ddp"):
                raise
    if not bases:
        raise WhatIfError("no strategy with collectives between ranks to predict from")
    first = bases.get("ddp") or next(iter(bases.values()))
    fits = {s: with_call_cost(fit_comm(b, contention), None if call_us is None else call_us / 1e3)
            for s, b in bases.items()}
    conts = {s: fit_contention(b, fits[s]) if contention else None for s, b in bases.items()}
    info, fitd = basis_info(first, fits[first.strategy], conts[first.strategy])
    rep = Report(info, fitd)
    hop_ms = None if hop_us is None else hop_us / 1e3
    if hop_ms is not None:
        rep.fit["hop_ms_used"] = hop_ms
    if bus_gbps:
        rep.fit["bus_gbps_used"] = bus_gbps  # (asked: beta replaced by this bus's per-byte cost)
    if caps:
        if "ddp" not in bases:
            raise WhatIfError("--bucket-cap needs ddp steps in the recording")
        b, fit = bases["ddp"], fits["ddp"]
        d = fit_delays(b)
        for c in caps:
            p = predict(b, fit, cap_mb=c, bus_gbps=bus_gbps, delays=d, hop_ms=hop_ms, contention=conts["ddp"])
            if not bus_gbps and hop_ms is None:
                p.measured = measured(store, "ddp", c)
            rep.caps.append(p)
    for s, b in bases.items():
        for n in worlds or []:
            p = predict(b, fits[s], world=n, bus_gbps=bus_gbps, hop_ms=hop_ms, contention=conts[s])
            if n == b.world and not bus_gbps and hop_ms is None:
                p.measured = measured(store, s, b.cap_mb)
            rep.worlds.append(p)
    if worlds or bus_gbps or hop_ms is not None:
        rep.note = UNCHECKED
    return rep


def ladder(store, caps=spec.BUCKET_LADDER_MB, upto: int | None = None, last: int = 20,
           reference_last: int | None = None, max_ranks: int | None = None):
    """The what-if panel's rows: (fit, basis, [(cap, prediction, measured or None)]), from the
    last `last` kept ddp steps at the cap in force at `upto` (and the last `reference_last`
    other steps of ddp and naive as the contention fit's reference, where given; `max_ranks`
    of the ranks replayed, where given: collect)."""
    b = collect(store, "ddp", upto=upto, last=last, reference_last=reference_last, max_ranks=max_ranks)
    fit = fit_comm(b, contention=True)
    d = fit_delays(b)
    cont = fit_contention(b, fit)
    rows = []
    for c in caps:
        p = predict(b, fit, cap_mb=float(c), delays=d, contention=cont)
        rows.append((float(c), p, measured(store, "ddp", float(c))))
    return fit, b, rows
