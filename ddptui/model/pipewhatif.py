"""A pipeline's step at other microbatch counts and schedules, from one recorded pipeline run
(`ddptui whatif` on a torch.distributed.pipelining run; docs/pipelines.md).

Measured, over the recorded steps after the first (MB and PIPE spans, ranks.wire):
- each stage's forward and backward of one microbatch (medians; a zero-bubble schedule's
  input-grad and weight-grad halves summed as its backward);
- a hop: what a microbatch's activations or gradients take from one stage to the next, the
  lower quartile of the gaps between a microbatch's end on one stage and its start on the
  next (a gap is a hop where the next stage was idle waiting for it; its lower quartile
  leaves out the gaps where that stage was still busy);
- a stage's own cost between two of its actions (posting its sends and receives, the loss):
  the lower quartile of the gaps between its consecutive microbatch spans;
- the step outside the schedule's step() (the optimizer, zeroing the gradients): median.

Predicted: the same global batch cut into m microbatches (a microbatch's work on a stage
`Scaling`: a + b / m, a fitted from a second recording at another count, else 0), run as
torch's GPipe or 1F1B code runs it (`_program`: every forward then every backward, or p − s
warm-up forwards on stage s then one backward one forward; the sends and receives posted and
waited where that code does), a transfer done a hop after both its stages posted it, the step
the last stage's end plus the time outside the schedule. Schedules of several stages a rank
(interleaved 1F1B, looped BFS: `simulate_multi`): each rank's recorded stage cut into v chunks
of equal work, stage c·p + r its c-th, each rank's actions in the order torch's schedule
computes (`_order`, checked against torch's `pipeline_order`), each as soon as the rank is free
and its input is there. Calibrated at the recorded
configuration: the model's step there beside the measured one (`at_recorded`); what it
leaves out (a stage's own cost around each action: posting and waiting for its sends and
receives, the loss) added to every prediction as a cost per forward and backward of a
microbatch on a rank, however many stages it holds (and, with a
second recording, a constant a step: fitted through both).
Pure: span batches in, plain data out; no torch.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ranks.wire import MB, PIPE, STEP, mb_of

SCHEDULES = ("gpipe", "1f1b")
# several stages a rank (its stage cut into `virtual` chunks of equal work, stage c·p + r on rank
# r), run in the order torch's schedule computes (`_order`)
MULTI = ("interleaved1f1b", "loopedbfs")
ALL = SCHEDULES + MULTI
VIRTUAL = 2  # stages a rank for MULTI, unless asked
DEFAULT = ("gpipe", "1f1b", "interleaved1f1b")  # predicted unless asked


class PipeWhatIfError(ValueError):
    """A recording this model cannot predict from; the message says why."""


@dataclass
class PipeMeasured:
    stages: int
    microbatches: int
    fwd_ms: list[float]  # by stage, one microbatch's forward
    bwd_ms: list[float]  # by stage, one microbatch's backward (input-grad + weight-grad)
    hop_ms: float
    outside_ms: float  # the step outside the schedule's step()
    step_ms: float  # measured, median
    schedule: str
    act_ms: float = 0.0  # a stage's own cost between two of its microbatch actions (posting its sends, the loss)
    layers: list[int] = field(default_factory=list)  # by stage, its blocks (where the run says them)


@dataclass
class Scaling:
    """A microbatch's forward and backward on each stage as a + b / m (m microbatches of one
    global batch): from two recordings at two counts, a fit; from one, b alone (a = 0)."""
    fwd_a: list[float]
    fwd_b: list[float]
    bwd_a: list[float]
    bwd_b: list[float]
    fitted: bool

    def at(self, m: int) -> tuple[list[float], list[float]]:
        return ([a + b / m for a, b in zip(self.fwd_a, self.fwd_b)],
                [a + b / m for a, b in zip(self.bwd_a, self.bwd_b)])


def scaling(meas: PipeMeasured, other: "PipeMeasured | None" = None) -> Scaling:
    """How a microbatch's work scales with the microbatch count. With `other` (the same
    pipeline recorded at another count) each stage's a + b / m through both (a clamped to
    at least 0, b at least 0); else all of it proportional to the microbatch's size."""
    p = meas.stages
    if other is None or other.microbatches == meas.microbatches or other.stages != p:
        m = meas.microbatches
        return Scaling([0.0] * p, [t * m for t in meas.fwd_ms], [0.0] * p, [t * m for t in meas.bwd_ms], False)

    def fit(t1: float, m1: int, t2: float, m2: int) -> tuple[float, float]:
        b = (t1 - t2) / (1 / m1 - 1 / m2)
        b = max(0.0, b)
        a = max(0.0, t1 - b / m1)
        return a, b
    fa, fb, ba, bb = [], [], [], []
    for s in range(p):
        a, b = fit(meas.fwd_ms[s], meas.microbatches, other.fwd_ms[s], other.microbatches)
        fa.append(a)
        fb.append(b)
        a, b = fit(meas.bwd_ms[s], meas.microbatches, other.bwd_ms[s], other.microbatches)
        ba.append(a)
        bb.append(b)
    return Scaling(fa, fb, ba, bb, True)


@dataclass
class PipePrediction:
    schedule: str
    microbatches: int
    step_ms: float
    bubble_pct: list[float] = field(default_factory=list)  # by stage (by rank where several a rank)
    plan_pct: float = 0.0
    virtual: int = 1  # stages a rank


def _q(vals: list[float], q: float) -> float:
    vals = sorted(vals)
    return vals[min(len(vals) - 1, int(q * len(vals)))]


def measure(steps: list[dict], info: dict) -> PipeMeasured:
    """steps: rank -> span batch each (the warm-up left out by the caller); info: RunInfo.pipeline."""
    stages = int(info.get("stages") or 0)
    m = int(info.get("microbatches") or 0)
    schedule = str(info.get("schedule"))
    rank_stages = {int(r): v for r, v in (info.get("rank_stages") or {}).items()}
    if stages < 2 or m < 1 or any(len(v) != 1 for v in rank_stages.values()):
        raise PipeWhatIfError(f"predicts from a recording of one stage a rank (GPipe or 1F1B, from which it predicts "
                              f"interleaved 1F1B and looped BFS too); this run's {schedule} holds several stages a rank")
    fwd: dict[int, list[float]] = {}
    bwd: dict[int, list[float]] = {}
    gaps: list[float] = []
    between: list[float] = []  # a stage's idle between two of its actions
    outside: list[float] = []
    step_ms: list[float] = []
    for ranks in steps:
        ends: dict[tuple, tuple[float, float]] = {}  # (stage, mb, "F"|"B") -> (start, end) ns
        longest = 0.0
        for r, b in ranks.items():
            kind, idx = b.kind, b.idx
            pipe = step = None
            half: dict[tuple, float] = {}
            for i in range(len(kind)):
                a, z = b.base_ns + 1000 * b.t0[i], b.base_ns + 1000 * b.t1[i]
                if kind[i] == MB:
                    s, mb, part = mb_of(idx[i])
                    d = (z - a) / 1e6
                    if part == 0:
                        fwd.setdefault(s, []).append(d)
                        ends[(s, mb, "F")] = (a, z)
                    elif part == 1:
                        bwd.setdefault(s, []).append(d)
                        ends[(s, mb, "B")] = (a, z)
                    else:  # (input-grad and weight-grad halves: one backward)
                        half[(s, mb)] = half.get((s, mb), 0.0) + d
                        if part == 2:
                            ends[(s, mb, "B")] = (a, z)
                elif kind[i] == PIPE:
                    pipe = (z - a) / 1e6
                elif kind[i] == STEP:
                    step = (z - a) / 1e6
            for (s, _mb), d in half.items():
                bwd.setdefault(s, []).append(d)
            own = sorted((b.t0[i], b.t1[i]) for i in range(len(kind)) if kind[i] == MB)
            between += [(x[0] - y[1]) / 1e3 for y, x in zip(own, own[1:]) if x[0] >= y[1]]
            if pipe is not None and step is not None:
                outside.append(max(0.0, step - pipe))
                longest = max(longest, step)
        if longest:
            step_ms.append(longest)
        for (s, mb, d), (a, z) in ends.items():
            nxt = (s + 1, mb, "F") if d == "F" else (s - 1, mb, "B")
            got = ends.get(nxt)
            if got is not None and got[0] >= z:
                gaps.append((got[0] - z) / 1e6)
    if len(fwd) < stages or len(bwd) < stages or not step_ms:
        raise PipeWhatIfError("no complete pipeline step in the recording (every stage's forwards and backwards)")
    own = {int(r): len(v) for r, v in (info.get("rank_layers") or {}).items()}
    by_stage = {v[0]: own[r] for r, v in rank_stages.items() if r in own and v}
    return PipeMeasured(stages, m, [statistics.median(fwd[s]) for s in range(stages)],
                        [statistics.median(bwd[s]) for s in range(stages)],
                        _q(gaps, 0.25) if gaps else 0.0, statistics.median(outside) if outside else 0.0,
                        statistics.median(step_ms), schedule, _q(between, 0.25) if between else 0.0,
                        [by_stage[s] for s in range(stages)] if len(by_stage) == stages else [])


def _program(schedule: str, s: int, p: int, m: int) -> list[tuple]:
    """Stage s's program as torch.distributed.pipelining's schedule runs it (schedules.py):
    ("post", [transfer...]) hands sends and receives to the backend, ("wait", [transfer...])
    waits for them, ("F"|"B", i) computes. A transfer: (microbatch, "F"|"B", from stage)."""
    def recv_f(i):
        return [(i, "F", s - 1)] if s > 0 else []

    def send_f(i):
        return [(i, "F", s)] if s < p - 1 else []

    def recv_b(i):
        return [(i, "B", s + 1)] if s < p - 1 else []

    def send_b(i):
        return [(i, "B", s)] if s > 0 else []
    prog: list[tuple] = []

    def exchange(ts):
        if ts:
            prog.append(("post", ts))
            prog.append(("wait", ts))
    if schedule == "gpipe":  # every forward (its sends waited for after them), then every backward
        for what, recv, send in (("F", recv_f, send_f), ("B", recv_b, send_b)):
            sent: list = []
            for i in range(m):
                exchange(recv(i))
                prog.append((what, i))
                if send(i):
                    prog.append(("post", send(i)))
                    sent += send(i)
            if sent:
                prog.append(("wait", sent))
        return prog
    # 1F1B (Schedule1F1B._step_microbatches)
    warm = min(m, p - s)
    f = b = 0
    pending: list = []  # sends posted, to be waited on
    fwd_sends: list = []
    for k in range(warm):
        exchange(recv_f(f))
        prog.append(("F", f))
        if pending:
            prog.append(("wait", pending))
            pending = []
        fwd_sends = send_f(f)
        if k != warm - 1 and fwd_sends:
            prog.append(("post", fwd_sends))
            pending, fwd_sends = fwd_sends, []
        f += 1
    bwd_sends: list = []
    while True:
        exchange(fwd_sends + recv_b(b))
        fwd_sends = []
        prog.append(("B", b))
        bwd_sends = send_b(b)
        b += 1
        if f == m:
            break
        exchange(bwd_sends + recv_f(f))
        bwd_sends = []
        prog.append(("F", f))
        fwd_sends = send_f(f)
        f += 1
    if bwd_sends:
        prog.append(("post", bwd_sends))
        pending = bwd_sends
    while b < m:
        exchange(recv_b(b))
        prog.append(("B", b))
        if pending:
            prog.append(("wait", pending))
        pending = send_b(b)
        if pending:
            prog.append(("post", pending))
        b += 1
    if pending:
        prog.append(("wait", pending))
    return prog


def valid(schedule: str, p: int, m: int, v: int = VIRTUAL, layers: list[int] | None = None) -> str:
    """Why `schedule` cannot run p ranks × m microbatches (v stages a rank), as torch refuses
    it (or a rank holds fewer blocks than v stages would take); '' where it can."""
    if schedule in MULTI and layers and min(layers) < v:
        return f"a rank holds {min(layers)} block(s): not {v} stages' worth"
    if schedule == "1f1b" and m < p:
        return f"1F1B needs at least as many microbatches as stages ({p})"
    if schedule == "interleaved1f1b":
        rounds = max(1, m // p)
        if m % rounds:
            near = sorted((k for k in range(max(1, m - 4), m + 5) if k % max(1, k // p) == 0), key=lambda k: (abs(k - m), k))
            return (f"torch's interleaved 1F1B runs its microbatches in rounds of about {p} (the ranks): {m} // {p} = "
                    f"{rounds} rounds, and {m} is not a multiple of {rounds} (try {' or '.join(map(str, sorted(near[:2])))})")
    if schedule in MULTI and v < 2:
        return f"{schedule} needs 2 or more stages a rank"
    return ""


def _order(schedule: str, r: int, p: int, v: int, m: int) -> list[tuple[str, int, int]]:
    """Rank r's microbatch actions ("F"|"B", stage, microbatch) in the order torch's schedule
    computes them (schedules.py: ScheduleInterleaved1F1B's and ScheduleLoopedBFS's
    `_calculate_single_rank_operations`, less their idle slots); stage c·p + r is the rank's
    c-th."""
    if schedule == "loopedbfs":
        own = [c * p + r for c in range(v)]
        return [("F", st, i) for st in own for i in range(m)] + \
               [("B", st, i) for st in reversed(own) for i in reversed(range(m))]
    per_round = m // max(1, m // p)
    warm = min((v - 1) * per_round + 2 * (p - 1 - r), m * v)
    total = v * m
    fdone: dict[int, int] = {}
    bdone: dict[int, int] = {}
    out: list[tuple[str, int, int]] = []

    def f(step: int) -> None:
        st = ((step // per_round) % v) * p + r
        out.append(("F", st, fdone.get(st, 0)))
        fdone[st] = fdone.get(st, 0) + 1

    def b(step: int) -> None:
        st = (v - 1 - ((step - warm) // per_round) % v) * p + r
        out.append(("B", st, bdone.get(st, 0)))
        bdone[st] = bdone.get(st, 0) + 1
    for op in range(warm + total):  # (warm-up forwards, then a forward and a backward, then backwards)
        if op < warm:
            f(op)
        elif op < total:
            f(op)
            b(op)
        else:
            b(op)
    return out


def simulate_multi(meas: PipeMeasured, schedule: str, m: int, v: int = VIRTUAL,
                   scale: Scaling | None = None) -> PipePrediction:
    """The step of a schedule of v stages a rank on m microbatches: each rank's recorded stage
    cut into v chunks of equal work (stage c·p + r: its c-th); every rank runs its actions in
    `_order`'s order, each as soon as the rank is free and its input is there (a forward: the
    stage before's forward of that microbatch, a hop later; a backward: the stage after's
    backward), as torch's runtime waits on each action's receive before computing it and
    sends after."""
    p = meas.stages
    fwd, bwd = (scale or scaling(meas)).at(m)
    orders = [_order(schedule, r, p, v, m) for r in range(p)]
    last = p * v - 1
    done: dict[tuple, float] = {}
    pos, now, busy = [0] * p, [0.0] * p, [0.0] * p
    hop = meas.hop_ms
    while any(pos[r] < len(orders[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                kind, st, i = orders[r][pos[r]]
                dep = (("F", st - 1, i) if st > 0 else None) if kind == "F" else \
                    (("B", st + 1, i) if st < last else ("F", st, i))
                if dep is not None and dep not in done:
                    break
                ready = done[dep] + (hop if dep[1] != st else 0.0) if dep is not None else 0.0
                c = (fwd if kind == "F" else bwd)[r] / v
                now[r] = max(now[r], ready) + c + meas.act_ms
                busy[r] += c
                done[(kind, st, i)] = now[r]
                pos[r] += 1
                moved = True
        if not moved:  # (never: torch's schedules are deadlock-free)
            raise PipeWhatIfError(f"{schedule} with {m} microbatches cannot be ordered")
    return _prediction(meas, schedule, m, v, now, busy)


def _prediction(meas: PipeMeasured, schedule: str, m: int, v: int, now: list[float], busy: list[float]) -> PipePrediction:
    """A simulated step: its last rank's end, each rank's bubble, the plan's (v stages a rank)."""
    p = meas.stages
    span = max(now)
    return PipePrediction(schedule, m, span + meas.outside_ms,
                          # (each stage's share of the whole step: in steady state a stage that ends
                          # early waits as long at its next step's start, inside its own step())
                          [round(100.0 * (1 - b / span), 1) if span > 0 else 0.0 for b in busy],
                          round(100.0 * (p - 1) / (v * m + p - 1), 1), v)


def simulate(meas: PipeMeasured, schedule: str, m: int, scale: Scaling | None = None) -> PipePrediction:
    """The step of `schedule` on m microbatches (the same global batch): every stage runs its
    program (`_program`); a transfer is done a hop after both its sender and its receiver
    posted it (a send waits for its receive, as gloo's and NCCL's do); a wait lasts until its
    transfers are done."""
    p = meas.stages
    fwd, bwd = (scale or scaling(meas)).at(m)
    cost = {"F": fwd, "B": bwd}
    hop = meas.hop_ms
    progs = [_program(schedule, s, p, m) for s in range(p)]
    pos, now, busy = [0] * p, [0.0] * p, [0.0] * p
    posted: dict[tuple, dict[int, float]] = {}  # transfer -> {stage: when it posted it}
    while any(pos[s] < len(progs[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while pos[s] < len(progs[s]):
                op = progs[s][pos[s]]
                if op[0] == "post":
                    for t in op[1]:
                        posted.setdefault(t, {})[s] = now[s]
                elif op[0] == "wait":
                    ends = []
                    for t in op[1]:
                        got = posted.get(t, {})
                        if len(got) < 2:
                            break
                        ends.append(max(got.values()) + hop)
                    else:
                        now[s] = max([now[s], *ends])
                        pos[s] += 1
                        moved = True
                        continue
                    break
                else:
                    c = cost[op[0]][s]
                    now[s] += c + meas.act_ms
                    busy[s] += c
                pos[s] += 1
                moved = True
        if not moved:  # (never: torch's schedules are deadlock-free)
            raise PipeWhatIfError(f"{schedule} with {m} microbatches cannot be ordered")
    return _prediction(meas, schedule, m, 1, now, busy)


def predict(meas: PipeMeasured, schedules=DEFAULT, microbatches=None, other: PipeMeasured | None = None,
            virtual: int = VIRTUAL) -> dict:
    """The model at the recorded configuration (beside the measured step), and every schedule
    × microbatch count asked (default: half, the same, twice and four times the recorded).
    `other`: the same pipeline recorded at another microbatch count (the work a microbatch
    costs whatever its size fitted from the two: `scaling`)."""
    m0 = meas.microbatches
    counts = list(microbatches) if microbatches else sorted({max(1, m0 // 2), m0, 2 * m0, 4 * m0})
    sched0 = meas.schedule if meas.schedule in SCHEDULES else "1f1b"
    sc = scaling(meas, other)
    at = simulate(meas, sched0, m0, sc)
    # calibrated where it was measured: what the model leaves out (a stage's own cost around
    # each action: posting and waiting for its sends and receives, the loss) as r0 + x a step
    # per action of a stage (2 m): from the recorded configuration, x alone; with a second
    # recording at another count, both (fitted through the two residuals)
    res0 = meas.step_ms - at.step_ms
    r0, x = 0.0, res0 / (2 * m0)
    osched = None
    if other is not None and sc.fitted:
        osched = other.schedule if other.schedule in SCHEDULES else sched0
        res1 = other.step_ms - simulate(meas, osched, other.microbatches, sc).step_ms
        m1 = other.microbatches
        x = (res1 - res0) / (2 * m1 - 2 * m0)
        r0 = res0 - x * 2 * m0

    def calibrated(r: PipePrediction) -> PipePrediction:
        # once a microbatch's forward and backward on a rank (2m), however many stages a rank:
        # interleaved 1F1B × 8 ran within ±5 % of 1F1B × 8 on 2 CPU ranks, where charging it a
        # chunk (2mV) predicted it 15 % slow: what it stands for does not grow with the chunks
        r.step_ms += r0 + x * 2 * r.microbatches
        return r

    def one(s: str, m: int) -> PipePrediction:
        if s in MULTI:
            return simulate_multi(meas, s, m, virtual, sc)
        return simulate(meas, s, m, sc)
    rows = [calibrated(one(s, m)) for s in schedules for m in counts
            if not valid(s, meas.stages, m, virtual, meas.layers)]
    left = [f"{s} at {m} microbatch{'es' if m != 1 else ''}: {why}" for s in schedules for m in counts
            for why in [valid(s, meas.stages, m, virtual, meas.layers)] if why]
    out_other = None
    if osched is not None:  # (the model at the other recording's count, beside it)
        o = calibrated(simulate(meas, osched, other.microbatches, sc))
        out_other = {"microbatches": other.microbatches, "step_ms": round(o.step_ms, 3),
                     "measured_ms": round(other.step_ms, 3),
                     "error_pct": round(100.0 * (o.step_ms - other.step_ms) / other.step_ms, 1)
                     if other.step_ms > 0 else None}
    return {"measured": {"schedule": meas.schedule, "stages": meas.stages, "microbatches": m0,
                         "step_ms": round(meas.step_ms, 3), "fwd_ms": [round(x, 3) for x in meas.fwd_ms],
                         "bwd_ms": [round(x, 3) for x in meas.bwd_ms], "hop_ms": round(meas.hop_ms, 3),
                         "act_ms": round(meas.act_ms, 3),
                         "outside_ms": round(meas.outside_ms, 3)},
            "at_recorded": {"schedule": sched0, "microbatches": m0, "step_ms": round(at.step_ms, 3),
                            "error_pct": round(100.0 * (at.step_ms - meas.step_ms) / meas.step_ms, 1)
                            if meas.step_ms > 0 else None,
                            "calibration": {"step_ms": round(r0, 3), "per_action_ms": round(x, 4)}},
            "scaling": {"fitted": sc.fitted, "fixed_fwd_ms": [round(x, 3) for x in sc.fwd_a],
                        "fixed_bwd_ms": [round(x, 3) for x in sc.bwd_a]},
            **({"at_other": out_other} if out_other is not None else {}),
            "predictions": [{"schedule": r.schedule, "microbatches": r.microbatches, "step_ms": round(r.step_ms, 3),
                             "bubble_pct": r.bubble_pct, "plan_pct": r.plan_pct,
                             **({"stages_a_rank": r.virtual} if r.virtual > 1 else {})} for r in rows],
            "not_predicted": left}


def text(doc: dict) -> list[str]:
    """The CLI's lines."""
    me, at = doc["measured"], doc["at_recorded"]
    out = [f"pipeline {me['schedule']}: {me['stages']} stages × {me['microbatches']} microbatches, step "
           f"{me['step_ms']:.1f} ms measured; the model at it: {at['step_ms']:.1f} ms"
           + (f" ({at['error_pct']:+.0f} %); below, {at['calibration']['per_action_ms']:+.2f} ms each action of a "
              f"stage{'' if not at['calibration']['step_ms'] else ' and ' + format(at['calibration']['step_ms'], '+.1f') + ' ms a step'}"
              " added, what the model leaves out where it was measured"
              if at.get("error_pct") is not None else ""),
           "  a microbatch: forward " + ", ".join(f"s{s} {v:.2f}" for s, v in enumerate(me["fwd_ms"]))
           + " ms · backward " + ", ".join(f"s{s} {v:.2f}" for s, v in enumerate(me["bwd_ms"]))
           + f" ms · hop {me['hop_ms']:.2f} ms · between two actions {me['act_ms']:.2f} ms · outside the schedule "
           + f"{me['outside_ms']:.1f} ms"]
    ot = doc.get("at_other")
    if ot is not None:
        sc = doc["scaling"]
        out.append(f"  with the recording at {ot['microbatches']} microbatches: a microbatch's fixed cost "
                      "(whatever its size) forward " + ", ".join(f"s{s} {v:.2f}" for s, v in enumerate(sc["fixed_fwd_ms"]))
                   + " ms, backward " + ", ".join(f"s{s} {v:.2f}" for s, v in enumerate(sc["fixed_bwd_ms"]))
                   + f" ms; the model at {ot['microbatches']}: {ot['step_ms']:.1f} ms against {ot['measured_ms']:.1f} "
                   + f"measured" + (f" ({ot['error_pct']:+.0f} %)" if ot.get("error_pct") is not None else ""))
    names = [r["schedule"] + (f" ×{r['stages_a_rank']}" if r.get("stages_a_rank") else "") for r in doc["predictions"]]
    w = max([len("schedule")] + [len(n) for n in names])
    out.append(f"  {'schedule':<{w}} {'microbatches':>12} {'step ms':>9} {'bubble % by stage':>22} {'plan %':>7}")
    stages = doc["measured"]["stages"]
    for name, r in zip(names, doc["predictions"]):
        bub = ", ".join(f"{x:.0f}" for x in r["bubble_pct"])
        multi = r["schedule"] in MULTI and r["microbatches"] < stages  # (its plan holds from m = p up)
        plan = f"{'-':>7}" if multi else f"{r['plan_pct']:>7.0f}"
        out.append(f"  {name:<{w}} {r['microbatches']:>12} {r['step_ms']:>9.1f} {bub:>22} {plan}")
    if any(r.get("stages_a_rank") for r in doc["predictions"]):
        v = max(r.get("stages_a_rank") or 1 for r in doc["predictions"])
        out.append(f"  (×{v}: {v} stages a rank, each rank's recorded stage cut into {v} of equal work, its bubble % by "
                   f"rank; a hop is paid {v} times as often, the calibration above once a microbatch's forward and "
                   f"backward as recorded)")
    for line in doc.get("not_predicted") or []:
        out.append(f"  not predicted: {line}")
    out.append("  (the same global batch in every row; a hop costs the same at any size; a microbatch's work "
               + ("its fixed cost plus the rest in proportion to its size)" if doc["scaling"]["fitted"] else
                  "scaled in proportion to its size: pass --and FILE, a recording at another microbatch count, to "
                  "fit the part that does not shrink)"))
    return out
