"""Deterministic synthetic runs: the frames ranks would send, without ranks.

Used by UI tests (snapshots must not depend on timing), the drawing and ingest benchmarks,
and anyone who wants to see the UI without torch. Timings follow the seeds' picture:
naive runs its AllReduces after backward, interleaved per parameter during backward, DDP
per bucket during backward. fsdp (FSDP2's picture, without torch): per layer an all-gather
of its parameters before its forward (the next one prefetched while it runs), an all-gather
again before its backward and a reduce-scatter of its gradients after it, every one a COLL
span described by a `colls` frame; `a2a_after=L` adds an all_to_all after layer L's forward
and before its backward (an expert layer's exchange) to every communicating strategy.
"""
from __future__ import annotations

import random
import threading
import time

from ranks import frames, spec
from ranks.wire import BWD, COLL, COMM, FWD, OPT, STEP

from ddptui.model.store import Store
from ddptui.model.updater import Updater


def hello(rank: int, world: int, model: str, strategies, batch: int = 1024,
          device: str = "cpu", backend: str = "gloo", bucket_cap_mb: float | None = None) -> frames.Hello:
    return frames.Hello(
        rank=rank, world=world, local_rank=rank, pid=0, host="synthetic",
        device=device, backend=backend, note="synthetic", torch="synthetic",
        model=model, layers=list(spec.layer_names(model)),
        params=[tuple(p) for p in spec.param_table(model)], strategies=list(strategies),
        batch=batch, steps=0, bucket_cap_mb=bucket_cap_mb, seed=0, lr=0.01, threads=1,
    )


def ddp_buckets(model: str, cap_mb: float = 25.0) -> list[list]:
    """DDP-like buckets: parameters in reverse order, filled up to cap_mb."""
    table = spec.param_table(model)
    cap = cap_mb * 2**20
    out, cur, size = [], [], 0
    for i in reversed(range(len(table))):
        nb = table[i][1] * spec.BYTES_PER_GRAD
        if cur and size + nb > cap:
            out.append([len(out), cur, size])
            cur, size = [], 0
        cur.append(i)
        size += nb
    if cur:
        out.append([len(out), cur, size])
    return out


class SyntheticRun:
    """Frames of a run, step by step. `ns_per_param` sets compute speed, `bw_gbps` comm.
    `slow = (rank, layer, ms)`: that rank's backward of that layer takes ms longer from step
    `slow_from` on (what --slow-rank does); `late = (share, lo_ms, hi_ms)`: in that share of
    the steps a random rank's random layer (forward or backward) is lo..hi ms late, as ranks
    sharing busy cores are."""

    def __init__(self, model: str = "small", world: int = 2, strategies=("naive", "ddp"),
                 seed: int = 0, batch: int = 1024, bucket_cap_mb: float = 25.0,
                 us_per_mparam: float = 2000.0, bw_gbps: float = 2.0, jitter: float = 0.05,
                 slow: tuple[int, int, float] | None = None, slow_from: int = 0,
                 late: tuple[float, float, float] | None = None, a2a_after: int | None = None):
        self.model, self.world, self.strategies = model, world, list(strategies)
        self.rng = random.Random(seed)
        self.batch = batch
        self.cap = bucket_cap_mb
        self.table = spec.param_table(model)
        self.layers = spec.layer_names(model)
        self.us_per_mparam = us_per_mparam
        self.bw = bw_gbps
        self.jitter = jitter
        self.t = 1_000_000_000  # ns clock
        self.buckets = ddp_buckets(model, bucket_cap_mb)
        self.slow, self.slow_from, self.late = slow, slow_from, late
        self._extra: dict[tuple[int, int, bool], int] = {}  # (rank, layer, backward) -> µs, this step
        self.a2a_after = a2a_after
        self.rows = self._coll_rows()  # the collectives table every rank sends (COLL idx: its id)
        self._row_id = {(r[1], r[5], r[6]): r[0] for r in self.rows}  # (op, layer, phase) -> id

    def layer_bytes(self, layer: int) -> int:
        """A layer's parameters' bytes (fp32): what FSDP gathers and reduce-scatters for it."""
        return sum(n for _, n, li in self.table if li == layer) * spec.BYTES_PER_GRAD

    def _coll_rows(self) -> list[tuple]:
        """(id, op, bytes, group size, group, layer, phase, async) of every collective issued."""
        rows: list[tuple] = []
        add = lambda op, nb, layer, phase: rows.append(  # noqa: E731
            (len(rows), op, nb, self.world, "default_pg", layer, phase, op != "all_to_all"))
        if "fsdp" in self.strategies:
            for i in range(len(self.layers)):
                add("all_gather", self.layer_bytes(i), i, "forward")
            for i in reversed(range(len(self.layers))):
                add("all_gather", self.layer_bytes(i), i, "backward")
                add("reduce_scatter", self.layer_bytes(i), i, "backward")
        if self.a2a_after is not None:
            widths = spec.MODEL_WIDTHS.get(self.model)
            width = widths[self.a2a_after + 1] if widths and self.a2a_after + 1 < len(widths) else 1024
            nb = max(1, self.batch // self.world) * width * 4
            add("all_to_all", nb, self.a2a_after, "forward")
            add("all_to_all", nb, self.a2a_after, "backward")
        return rows

    def header_frames(self) -> list[frames.Hello]:
        return [hello(r, self.world, self.model, self.strategies, self.batch, bucket_cap_mb=self.cap)
                for r in range(self.world)]

    def _j(self, v: float) -> int:
        return max(1, int(v * (1 + self.rng.uniform(-self.jitter, self.jitter))))

    def _layer_us(self, layer: int, backward: bool) -> int:
        numel = sum(n for _, n, li in self.table if li == layer)
        return self._j(numel / 1e6 * self.us_per_mparam * (2 if backward else 1) / self.world + 20)

    def _comm_us(self, nbytes: int) -> int:
        return self._j(30 + nbytes / (self.bw * 1e3))

    def step_frames(self, step: int) -> list[frames.Frame]:
        """Frames for one step of every strategy on every rank (plus a buckets frame at 0)."""
        out = []
        for s in self.strategies:
            base = self.t
            longest = 0
            ranks = range(spec.strategy_ranks(s, self.world))
            self._extra = {}
            if self.slow is not None and step >= self.slow_from:
                self._extra[(self.slow[0], self.slow[1], True)] = int(self.slow[2] * 1000)
            if self.late is not None and len(ranks) > 1 and self.rng.random() < self.late[0]:
                key = (self.rng.randrange(len(ranks)), self.rng.randrange(len(self.layers)), self.rng.random() < 0.5)
                self._extra[key] = self._extra.get(key, 0) + int(self.rng.uniform(self.late[1], self.late[2]) * 1000)
            for r in ranks:
                if step == 0 and (s == "fsdp" or (self.a2a_after is not None and s != "single")):
                    out.append(frames.Colls(rank=r, strategy=s, rows=list(self.rows)))
                if s == "ddp" and step == 0:
                    out.append(frames.Buckets(rank=r, strategy="ddp", step=step, cap_mb=self.cap,
                                              buckets=[(b, list(ps), n) for b, ps, n in self.buckets]))
                kinds, idxs, t0, t1, iss = self._one(s, r, base)
                out.append(frames.spans_frame(r, s, step, base, kinds, idxs, t0, t1, iss))
                longest = max(longest, t1[0] - base)
            self.t = base + longest + 200_000
        return out

    def _one(self, s: str, rank: int, base: int):
        if s == "fsdp":
            return self._fsdp(rank, base)
        n_layers = len(self.layers)
        kinds, idxs, t0, t1, iss = [], [], [], [], []
        t = base + self._j(50) * 1000 * rank // 4
        scale = self.world if s == "single" else 1
        a2a = self.a2a_after if s != "single" else None

        def exchange(phase):  # a blocking all_to_all between layers (COLL)
            nonlocal t
            rid = self._row_id[("all_to_all", a2a, phase)]
            z = t + self._comm_us(self.rows[rid][2]) * 1000
            kinds.append(COLL); idxs.append(rid); t0.append(t); t1.append(z); iss.append(t)
            t = z + 5000

        for i in range(n_layers):
            d = (self._layer_us(i, False) * scale + self._extra.get((rank, i, False), 0)) * 1000
            kinds.append(FWD); idxs.append(i); t0.append(t); t1.append(t + d); t += d + 5000
            if i == a2a:
                exchange("forward")
        bwd_end_of = {}
        for i in reversed(range(n_layers)):
            if i == a2a:
                exchange("backward")
            d = (self._layer_us(i, True) * scale + self._extra.get((rank, i, True), 0)) * 1000
            kinds.append(BWD); idxs.append(i); t0.append(t); t1.append(t + d); t += d + 5000
            bwd_end_of[i] = t
        comm_free = 0

        def comm(idx, ready, nbytes):
            nonlocal comm_free
            a = max(ready, comm_free)
            z = a + self._comm_us(nbytes) * 1000
            kinds.append(COMM); idxs.append(idx); t0.append(a); t1.append(z); iss.append(ready)
            comm_free = z
            return z

        end = t
        if s == "naive":
            for pi, (_, numel, _) in enumerate(self.table):
                end = comm(pi, max(end, comm_free), numel * spec.BYTES_PER_GRAD)
        elif s == "interleaved":
            for pi in reversed(range(len(self.table))):
                end = max(end, comm(pi, bwd_end_of[self.table[pi][2]],
                                    self.table[pi][1] * spec.BYTES_PER_GRAD))
        elif s == "ddp":
            for b, params, nbytes in self.buckets:
                ready = max(bwd_end_of[self.table[p][2]] for p in params)
                end = max(end, comm(b, ready, nbytes))
        opt = self._j(300) * 1000
        kinds.append(OPT); idxs.append(0); t0.append(end); t1.append(end + opt)
        end += opt
        kinds.insert(0, STEP); idxs.insert(0, 0); t0.insert(0, base); t1.insert(0, end)
        return kinds, idxs, t0, t1, iss

    def _fsdp(self, rank: int, base: int):
        """FSDP2's step: all-gathers on one stream (the next layer's prefetched while a layer
        runs), a layer's compute once its all-gather is done, a reduce-scatter after each
        backward; spans in time order."""
        n_layers = len(self.layers)
        ev = []  # (start, kind, idx, end, ready)
        t = base + self._j(50) * 1000 * rank // 4
        free = t  # the communication stream

        def coll(op, layer, phase, ready):
            nonlocal free
            rid = self._row_id[(op, layer, phase)]
            a = max(ready, free)
            z = a + self._comm_us(self.rows[rid][2] // self.world) * 1000
            ev.append((a, COLL, rid, z, ready))
            free = z
            return z

        gathered = coll("all_gather", 0, "forward", t)
        for i in range(n_layers):
            nxt = coll("all_gather", i + 1, "forward", t) if i + 1 < n_layers else None  # prefetch
            a = max(t, gathered)
            d = (self._layer_us(i, False) + self._extra.get((rank, i, False), 0)) * 1000
            ev.append((a, FWD, i, a + d, None))
            t = a + d + 5000
            gathered = nxt
        gathered = coll("all_gather", n_layers - 1, "backward", t)
        for i in reversed(range(n_layers)):
            nxt = coll("all_gather", i - 1, "backward", t) if i > 0 else None
            a = max(t, gathered)
            d = (self._layer_us(i, True) + self._extra.get((rank, i, True), 0)) * 1000
            ev.append((a, BWD, i, a + d, None))
            t = a + d + 5000
            coll("reduce_scatter", i, "backward", t)
            gathered = nxt
        end = max(t, free)
        opt = self._j(300) * 1000
        ev.append((end, OPT, 0, end + opt, None))
        end += opt
        ev.sort(key=lambda e: (e[0], e[1] != COLL))
        kinds, idxs, t0, t1, iss = [STEP], [0], [base], [end], []
        for a, k, i, z, ready in ev:
            kinds.append(k); idxs.append(i); t0.append(a); t1.append(z)
            if k == COLL:
                iss.append(ready)
        return kinds, idxs, t0, t1, iss

    def gpu_frame(self, step: int, n_gpus: int = 2) -> frames.Gpu:
        gpus = []
        for i in range(n_gpus):
            gpus.append(frames.GpuSample(index=i, name="Synthetic GPU", util=float((37 * step + 23 * i) % 100),
                                         mem_used_mb=20000.0 + 100 * i, mem_total_mb=81920.0, power_w=250.0,
                                         sm_clock_mhz=1755.0, pcie_tx_mbs=None, pcie_rx_mbs=None,
                                         nvlink_tx_mbs=None, nvlink_rx_mbs=None))
        return frames.Gpu(ts=self.t, gpus=gpus)


def fill_store(store, run: SyntheticRun, steps: int, gpu: bool = False) -> None:
    """Feed a store with `steps` steps of a synthetic run (and compute figures)."""
    for f in run.header_frames():
        store.ingest(f)
    for k in range(steps):
        for f in run.step_frames(k):
            store.ingest(f)
        if gpu:
            store.ingest(run.gpu_frame(k))
    store.update()


class SyntheticSource:
    """The one synthetic source (a `ddptui.ui.source.Source` with `BucketControl`): a Store
    filled with `steps` steps of a SyntheticRun, for UI tests, snapshots, benchmarks and
    demos without torch. `add_steps(n)` adds steps now; `ahead` more steps arrive on the
    wall clock, `per_s` a second after start(), as a live run's do: put into the store by a
    thread of their own (a live run's collector) and counted by an Updater (benchmarks);
    `slow`: SyntheticRun's slow rank. It
    records what the app asks of it: `calls`, `polls`."""

    def __init__(self, steps: int = 6, world: int = 2, model: str = "medium", strategies=("naive", "ddp"),
                 gpu: bool = False, seed: int = 3, ahead: int = 0, per_s: float = 0.0,
                 slow: tuple[int, int, float] | None = None, a2a_after: int | None = None):
        self.run = SyntheticRun(model, world, strategies, seed=seed, slow=slow, a2a_after=a2a_after)
        self.store = Store()
        self.steps = 0
        if steps:
            self.add_steps(steps, gpu)
        self.pending = [self.run.step_frames(k) + [self.run.gpu_frame(k)]
                        for k in range(self.steps, self.steps + ahead)]
        self.every = 1.0 / per_s if per_s else float("inf")
        self.next_at = 0.0
        self.state, self.message = "running", ""
        self.calls: list[tuple] = []
        self.polls = 0
        self.updater = Updater(self.store)
        self._halt = threading.Event()

    def add_steps(self, n: int, gpu: bool = False) -> None:
        """n more steps now (GPU samples with them on the first fill only)."""
        if self.steps == 0:
            fill_store(self.store, self.run, n, gpu=gpu)
        else:
            for k in range(self.steps, self.steps + n):
                for f in self.run.step_frames(k):
                    self.store.ingest(f)
            self.store.update()
        self.steps += n

    def start(self) -> None:
        self.calls.append(("start",))
        self.next_at = time.monotonic() + self.every
        if self.pending and self.every != float("inf"):
            threading.Thread(target=self._feed, name="ddptui-synthetic-feed", daemon=True).start()
            self.updater.start()

    def _feed(self) -> None:
        while self.pending and not self._halt.wait(max(0.0, self.next_at - time.monotonic())):
            for f in self.pending.pop(0):
                self.store.ingest(f)
            self.next_at += self.every

    def poll(self) -> bool:
        self.polls += 1
        return self.state != "running"

    def set_bucket_cap(self, mb: float) -> int:
        self.calls.append(("set_bucket_cap", mb))
        return self.run.world

    def stop(self, why: str = "") -> None:
        self.calls.append(("stop", why))
        self._halt.set()
        self.updater.stop()
        if self.state == "running":
            self.state = "stopped"
