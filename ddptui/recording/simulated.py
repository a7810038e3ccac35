"""Simulated runs (`ddptui demo`): the frames a run of a built-in model would send on a named
machine (ddptui.model.profiles), made by the step simulator (ddptui.model.whatif) and written
as an ordinary recording, labelled SIMULATED in its header (`simulated`) and its hellos.

Per step and rank: each layer's forward (1/3 of its compute) and backward (2/3) from the
profile (`Profile.compute_ms`: FLOPs at its fp32 rate, split over the GPUs, plus a fixed cost
per layer), with jitter; the gradient collectives of naive (blocking, one per parameter after
the backward), interleaved (one per parameter as its gradient is ready) and ddp (DDP's buckets
at the default cap, first bucket 1 MiB) placed by `whatif.simulate` with the profile's
collective model (the per-call host cost on the issuing thread, one NCCL stream, a collective
starting once every rank has it ready); then the optimizer and the step overhead. single: one
GPU, the whole batch. fsdp (as SyntheticRun's, timed by the profile): per layer an all-gather
before its forward (the next prefetched), again before its backward, a reduce-scatter after
it, each (N-1) ring steps + bytes x (N-1)/N at the bus bandwidth; optimizer on 1/N. No
contention: nothing in seed 002 measures how much overlap slows either side.

Steps of milliseconds would flash by in a replay at 1x: the steps are spaced `pace_s` apart
(one step of every strategy) on the recording's clock; the time between them is idle, outside
every step and every figure.
"""
from __future__ import annotations

import os
import random
import time

from ranks import frames, spec
from ranks.recfile import RecordWriter
from ranks.wire import BWD, COLL, COMM, FWD, OPT, STEP

from ddptui import __version__
from ddptui.model import whatif
from ddptui.model.profiles import SEED_BATCH, Profile

GAP_NS = 200_000  # between one strategy's step and the next one's (ns)


class SimulatedRun:
    """Frames of a simulated run, step by step (deterministic for a seed)."""

    def __init__(self, profile: Profile, model: str, gpus: int, strategies, seed: int = 0,
                 jitter: float = 0.03, pace_s: float = 0.5):
        self.p, self.model, self.world = profile, model, gpus
        self.strategies = list(strategies)
        self.rng = random.Random(seed)
        self.seed = seed
        self.jitter = jitter
        self.gap_ns = max(GAP_NS, int(pace_s * 1e9 / max(1, len(self.strategies))))
        self.table = spec.param_table(model)
        self.layers = spec.layer_names(model)
        self.nbytes = [n * spec.BYTES_PER_GRAD for _, n, _ in self.table]
        self.player = [li for _, _, li in self.table]
        self.fit = profile.fit()
        self.t = 1_000_000_000
        self.bases = {s: whatif.synthetic_basis([(n, li) for _, n, li in self.table], spec.BYTES_PER_GRAD,
                                                1.0, strategy=s, world=gpus)
                      for s in self.strategies if s in ("naive", "interleaved", "ddp")}
        self.plans = {s: whatif.plan(b, explicit=False) if s == "ddp" else whatif.plan(b)
                      for s, b in self.bases.items()}
        self.buckets = [(i, list(ps), nb) for i, (ps, nb) in enumerate(self.plans.get("ddp", []))]
        self.rows = self._coll_rows()
        self._row_id = {(r[1], r[5], r[6]): r[0] for r in self.rows}

    # -- what the header and the hellos say ---------------------------------------------
    def simulated(self) -> dict:
        return {"profile": self.p.key, "name": self.p.name, "gpus": self.world, "basis": self.p.basis,
                "generator": "ddptui demo (ddptui.model.whatif's step simulator)", "seed": self.seed,
                "extrapolated": {s: self.p.extrapolated(self.model, self.world if s != "single" else 1, s)
                                 for s in self.strategies}}

    def meta(self, steps: int) -> dict:
        return {"ddptui": __version__, "created": time.time(), "model": self.model,
                "layers": list(self.layers), "params": [list(p) for p in self.table],
                "strategies": self.strategies, "world": self.world, "batch": SEED_BATCH, "steps": steps,
                "bucket_cap_mb": None, "seed": self.seed, "lr": 0.01, "device": "cuda", "gpus": self.world,
                "note": self.note(), "settings": {}, "torch": "simulated", "backend": "nccl",
                "devices": {str(r): f"cuda:{r}" for r in range(self.world)}, "host": "simulated",
                "simulated": self.simulated()}

    def note(self) -> str:
        return f"SIMULATED on {self.p.name} ({self.world} GPUs) by ddptui demo: no GPU ran this"

    def header_frames(self) -> list:
        out = [frames.Status(text=self.note(), level="warn", ts=time.time())]
        for r in range(self.world):
            out.append(frames.Hello(
                rank=r, world=self.world, local_rank=r, pid=0, host="simulated", device=f"cuda:{r}",
                backend="nccl", note=self.note(), torch="simulated", model=self.model,
                layers=list(self.layers), params=[tuple(p) for p in self.table], strategies=self.strategies,
                batch=SEED_BATCH, steps=0, bucket_cap_mb=None, seed=self.seed, lr=0.01, threads=1))
        return out

    def _coll_rows(self) -> list[tuple]:
        rows: list[tuple] = []
        if "fsdp" not in self.strategies:
            return rows
        add = lambda op, layer, phase: rows.append(  # noqa: E731
            (len(rows), op, self.layer_bytes(layer), self.world, "default_pg", layer, phase, True))
        for i in range(len(self.layers)):
            add("all_gather", i, "forward")
        for i in reversed(range(len(self.layers))):
            add("all_gather", i, "backward")
            add("reduce_scatter", i, "backward")
        return rows

    def layer_bytes(self, layer: int) -> int:
        return sum(nb for nb, li in zip(self.nbytes, self.player) if li == layer)

    # -- steps ---------------------------------------------------------------------------
    def _j(self, v: float, k: float = 1.0) -> float:
        return v * (1 + self.rng.uniform(-k * self.jitter, k * self.jitter))

    def step_frames(self, step: int) -> list:
        out = []
        for s in self.strategies:
            n = spec.strategy_ranks(s, self.world)
            if step == 0 and s == "ddp":
                out += [frames.Buckets(rank=r, strategy="ddp", step=0, cap_mb=None, buckets=self.buckets)
                        for r in range(n)]
            if step == 0 and s == "fsdp":
                out += [frames.Colls(rank=r, strategy="fsdp", rows=list(self.rows)) for r in range(n)]
            per_rank = self._fsdp(n) if s == "fsdp" else self._step(s, n)
            base = self.t
            longest = 0
            for r, (kinds, idxs, t0, t1, iss) in enumerate(per_rank):
                ns = lambda v: base + int(v * 1e6)  # noqa: E731  (ms -> ns on the run's clock)
                out.append(frames.spans_frame(r, s, step, base, kinds, idxs, [ns(v) for v in t0],
                                              [ns(v) for v in t1], [ns(v) for v in iss]))
                longest = max(longest, int(t1[0] * 1e6))
            self.t = base + max(longest + GAP_NS, self.gap_ns)
        return out

    def _timeline(self, r: int, gpus: int, tail: float):
        """One rank's compute: a RankTimeline (ms from the step's origin) and its spans."""
        start = self.rng.uniform(0.0, 0.02)
        per = self.p.compute_ms(self.model, gpus)
        spans, t = [], start
        for i, c in enumerate(per):
            d = self._j(c / 3)
            spans.append((FWD, i, t, t + d))
            t += d
        bwd_end, bwd_span = {}, {}
        for i in reversed(range(len(per))):
            d = self._j(2 * per[i] / 3)
            spans.append((BWD, i, t, t + d))
            bwd_span[i] = (t, t + d)
            t = bwd_end[i] = t + d
        tl = whatif.RankTimeline(r, start, t + tail, [(start, t)], bwd_end, [], bwd_span=bwd_span)
        return tl, spans

    def _step(self, s: str, n: int):
        gpus = 1 if s == "single" else self.world
        opt = self.p.opt_ms(self.model)
        tails = [self._j(opt + self.p.overhead_ms(self.model, gpus)) for _ in range(n)]
        tls = {}
        comp = {}
        for r in range(n):
            tls[r], comp[r] = self._timeline(r, gpus, tails[r])
        colls = self.plans.get(s, []) if n > 1 else []
        costs = iter([self.fit.ms(nb, self.world) * self.rng.lognormvariate(0, 2 * self.jitter)
                      for _, nb in colls])
        delays = whatif.Delays({}, {})
        blocking = s == "naive"
        sim = whatif.simulate(tls, colls, lambda nb: next(costs), 1, delays, self.player, blocking,
                              self.fit.call_ms)
        out = []
        for r, tl in tls.items():
            if colls and not blocking:  # the compute as simulate moved it (host cost per call)
                issued = whatif._issue_times(tl, colls, delays, self.player, r)
                moved = whatif.with_calls(tl, issued, self.fit.call_ms)
                sh = {i: moved.bwd_span[i] for i in moved.bwd_span}
                issue = [v + self.fit.call_ms for v in issued]
            else:
                sh, issue = None, [a for a, _ in sim[r].comm]
            kinds, idxs, t0, t1, iss = [], [], [], [], []
            last = tl.start
            for k, i, a, z in comp[r]:
                if k == BWD and sh is not None:
                    a, z = sh[i]
                kinds.append(k); idxs.append(i); t0.append(a); t1.append(z)  # noqa: E702
                last = max(last, z)
            for c, ((params, _), (a, z)) in enumerate(zip(colls, sim[r].comm)):
                idx = c if s == "ddp" else params[0]
                kinds.append(COMM); idxs.append(idx); t0.append(a); t1.append(z); iss.append(min(a, issue[c]))  # noqa: E702
                last = max(last, z)
            end = tl.start + sim[r].step_ms
            kinds.append(OPT); idxs.append(0); t0.append(last); t1.append(max(last, end))  # noqa: E702
            out.append(([STEP] + kinds, [0] + idxs, [tl.start] + t0, [max(last, end)] + t1, iss))
        return out

    def _fsdp(self, n: int):
        """FSDP2's step on every rank at once: collectives on one stream, each starting when
        every rank has issued it; a layer computes once its all-gather is done."""
        per = self.p.compute_ms(self.model, n)
        hop, call = self.fit.hop_ms, self.fit.call_ms
        t = [self.rng.uniform(0.0, 0.02) for _ in range(n)]
        starts = list(t)
        ev: list[list] = [[] for _ in range(n)]  # per rank: (kind, idx, a, z, ready)
        free = 0.0

        def coll(op, layer, phase):
            nonlocal free
            rid = self._row_id[(op, layer, phase)]
            nb = self.rows[rid][2]
            ready = []
            for r in range(n):
                t[r] += call  # the host cost, on the issuing thread
                ready.append(t[r])
            a = max(max(ready), free)
            z = a + ((n - 1) * hop + nb * (n - 1) / n / (self.p.bus_gbps * 1e9) * 1e3) \
                * self.rng.lognormvariate(0, 2 * self.jitter)
            for r in range(n):
                ev[r].append((COLL, rid, max(ready[r], free), z, ready[r]))
            free = z
            return z

        def compute(kind, layer, after):
            for r in range(n):
                a = max(t[r], after)
                d = self._j(per[layer] * (1 / 3 if kind == FWD else 2 / 3))
                ev[r].append((kind, layer, a, a + d, None))
                t[r] = a + d

        layers = len(self.layers)
        g = coll("all_gather", 0, "forward")
        for i in range(layers):
            nxt = coll("all_gather", i + 1, "forward") if i + 1 < layers else None
            compute(FWD, i, g)
            g = nxt
        g = coll("all_gather", layers - 1, "backward")
        for i in reversed(range(layers)):
            nxt = coll("all_gather", i - 1, "backward") if i > 0 else None
            compute(BWD, i, g)
            coll("reduce_scatter", i, "backward")
            g = nxt
        out = []
        for r in range(n):
            last = max(t[r], free)
            tail = self._j(self.p.opt_ms(self.model) / n + self.p.overhead_ms(self.model, n))
            ev[r].append((OPT, 0, last, last + tail, None))
            ev[r].sort(key=lambda e: (e[2], e[0] != COLL))
            kinds, idxs, t0, t1, iss = [STEP], [0], [starts[r]], [last + tail], []
            for k, i, a, z, ready in ev[r]:
                kinds.append(k); idxs.append(i); t0.append(a); t1.append(z)  # noqa: E702
                if k == COLL:
                    iss.append(ready)
            out.append((kinds, idxs, t0, t1, iss))
        return out

    def bye_frames(self) -> list:
        return [frames.Bye(rank=r, why="done", dropped=0, dropped_frames=0) for r in range(self.world)]


def write(path: str, run: SimulatedRun, steps: int, progress=None) -> str:
    """The run's `steps` steps per strategy as a recording at `path` (written to a temporary
    file beside it, renamed when complete); progress(step, steps) after each step."""
    tmp = f"{path}.part-{os.getpid()}"
    w = RecordWriter(tmp, run.meta(steps))
    try:
        for f in run.header_frames():
            w.write(f)
        for k in range(steps):
            for f in run.step_frames(k):
                w.write(f)
            if progress is not None:
                progress(k + 1, steps)
        for f in run.bye_frames():
            w.write(f)
        w.close()
        os.replace(tmp, path)
    except BaseException:
        w.close()
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
