"""The Store's queries, one job: answering readers. Every query is read-only, takes the lock
and returns copies (or objects never changed once made: span batches, step figures, waits),
so the UI, the reports and the tools may call them from any thread. Works on the Store's
state (declared in store/__init__.py); `summaries()` asks figuring.py's `update()` first.
`summary`/`bucket_rows` and `view` shape what these return (model/summary.py, model/views.py)."""
from __future__ import annotations

from ranks import spec
from ranks.wire import SpanBatch

from .. import figures
from .. import hang
from .. import stragglers
from ..summary import bucket_rows, strategy_summary
from ..views import StepView, step_view
from .history import in_force
from .rankinfo import RankInfo


def _copy(assignment: list) -> list:
    """A bucket assignment's copy: [[bucket, [param idx...], bytes], ...]."""
    return [[b, list(ps), n] for b, ps, n in assignment]


class Queries:
    """Read-only queries (a part of Store: the state they read is declared in Store.__init__)."""

    # -- the run: world, strategies, ranks, hosts -------------------------------------------
    @property
    def world(self) -> int:
        return int(self.meta.world or max(len(self.ranks), 1))

    def expected_ranks(self, strategy: str) -> int:
        return spec.strategy_ranks(strategy, self.world)

    def strategies(self) -> list[str]:
        with self.lock:
            named, known = self.meta.strategies, len(self.raw)  # (raw only grows)
            got = self._strategies
            if got is None or got[0] is not named or got[1] != known:
                order = list(named or [])
                got = self._strategies = (named, known, order + [s for s in self.raw if s not in order])
            return list(got[2])

    def rank_snapshot(self) -> dict[int, RankInfo]:
        """A copy of every rank's state, taken under the lock (safe from any thread)."""
        with self.lock:
            return {r: i.copy() for r, i in self.ranks.items()}

    def first_rank(self) -> RankInfo | None:
        """A copy of the lowest rank's state (what the title says of device and backend)."""
        with self.lock:
            return self.ranks[min(self.ranks)].copy() if self.ranks else None

    def dropped_spans(self) -> list[tuple[int, int]]:
        """(rank, spans it dropped) of the ranks that dropped any, by rank."""
        with self.lock:
            return sorted((r, i.dropped_spans) for r, i in self.ranks.items() if i.dropped_spans)

    def hosts(self) -> dict[int, list[int]]:
        """node rank -> its ranks (ranks no connection placed are node 0's)."""
        with self.lock:
            out: dict[int, list[int]] = {}
            for r in sorted(self.ranks):
                out.setdefault(self.node_of.get(r, 0), []).append(r)
            return out

    # -- clocks (multi-node) -----------------------------------------------------------------
    def to_common(self, rank: int, ns: int) -> int:
        """A time of `rank`'s host clock on node 0's axis (identity on one host)."""
        return self.host_clocks.to_common(rank, ns)

    def clock_samples(self, node: int) -> list:
        """Multi-node: the latest collectives between `node` and node 0 (CollSample, raw times)."""
        with self.lock:
            return list(self._coll.get(node, ()))

    def clock_offsets(self) -> list[dict]:
        """Per host: its offset onto node 0's clock and the uncertainty (JSON `clock_offsets`)."""
        with self.lock:
            return self.host_clocks.offsets(self.meta.host)

    # -- steps and their figures -------------------------------------------------------------
    def complete_steps(self, strategy: str) -> list[int]:
        with self.lock:
            return list(self.step_figs.get(strategy, {}))

    def latest_complete(self, strategy: str) -> int | None:
        with self.lock:
            figs = self.step_figs.get(strategy)
            return next(reversed(figs)) if figs else None

    def last_complete(self, strategy: str, upto: int | None = None, lookback: int = 10_000) -> int | None:
        """The newest complete step of a strategy at or before `upto` (None: the newest)."""
        with self.lock:
            figs = self.step_figs.get(strategy)
            if not figs:
                return None
            if upto is None:
                return next(reversed(figs))
            if upto in figs:
                return upto
            for i, k in enumerate(reversed(figs)):
                if k <= upto or i > lookback:
                    return k if k <= upto else None
        return None

    def step_figures(self, strategy: str) -> list[figures.StepFigures]:
        """The figures of every kept complete step of a strategy, oldest first (a new list)."""
        with self.lock:
            return list(self.step_figs.get(strategy, {}).values())

    def recent_figures(self, strategy: str, upto: int | None = None, n: int = 20,
                       since: int = 0) -> list[figures.StepFigures]:
        """Up to n complete steps' figures with since <= k <= upto, oldest first."""
        out = []
        with self.lock:
            figs = self.step_figs.get(strategy, {})
            for k in reversed(figs):
                if upto is not None and k > upto:
                    continue
                if k < since or len(out) >= n:
                    break
                out.append(figs[k])
        out.reverse()
        return out

    def oldest_step(self) -> int:
        """The oldest step whose spans every strategy still keeps (0: none kept)."""
        with self.lock:  # (the marked steps kept past the window for their evidence: not in it)
            kept = []
            for strategy, per in self.raw.items():
                stays = self.stays.get(strategy)
                got = min((k for k in per if k not in stays), default=None) if stays else \
                    (min(per) if per else None)
                if got is not None:
                    kept.append(got)
            return max(kept) if kept else 0

    def span_batches(self) -> dict[str, dict[int, dict[int, SpanBatch]]]:
        """strategy -> step -> rank -> its span batch, for every kept step (a copy of the
        mappings, taken under the lock; the batches themselves are never changed once in)."""
        with self.lock:
            return {s: {k: dict(ranks) for k, ranks in per.items()} for s, per in self.raw.items()}

    def step_batches(self, strategy: str, step: int) -> dict[int, SpanBatch] | None:
        """rank -> its span batch of one kept step, by rank (a new mapping; None: not kept)."""
        with self.lock:
            ranks = self.raw.get(strategy, {}).get(step)
            return dict(sorted(ranks.items())) if ranks else None

    def step_intervals(self, strategy: str) -> list[tuple[int, int, int]]:
        """(step, start ns, end ns) of the kept complete steps of a strategy, on
        CLOCK_MONOTONIC (the clock of gpu/cpu samples; per-strategy NVML figures): from the
        first rank's STEP start to the last rank's end (made once, by update(), when the
        step completes)."""
        with self.lock:
            iv = self._intervals
            return [(k, *iv[(strategy, k)]) for k in self.raw.get(strategy, {}) if (strategy, k) in iv]

    # -- who waited for whom -----------------------------------------------------------------
    def step_waits(self, strategy: str, step: int) -> stragglers.StepWaits | None:
        """Who waited for whom in one kept complete step (None: not kept, not complete, or
        fewer than two ranks communicating)."""
        with self.lock:
            return self.waits.get(strategy, {}).get(step)

    def recent_waits(self, strategy: str, upto: int | None = None,
                     n: int | None = 20, stays: bool = False) -> list[stragglers.StepWaits]:
        """Who waited for whom in the last n (None: all) kept steps 0 < k <= upto that had
        collectives on two or more ranks, oldest first; the marked steps kept past the window
        for their evidence (`stays`) only when asked for."""
        with self.lock:
            skip = () if stays else self.stays.get(strategy, ())
            got = [w for k, w in self.waits.get(strategy, {}).items()
                   if w is not None and k > 0 and (upto is None or k <= upto) and k not in skip]
        return got if n is None else got[-n:]

    def evidence_waits(self, strategy: str, upto: int | None = None) -> list[stragglers.StepWaits]:
        """Where layers are marked on a sample of steps, the kept steps 0 < k <= upto whose
        layers were marked, those kept past the window too: what the per-layer evidence
        judges, oldest first."""
        return [s for s in self.recent_waits(strategy, upto, None, stays=True)
                if s.batches and stragglers.layered(s)]

    def waits_kept(self, strategy: str) -> bool:
        """Whether any kept step of a strategy has its who-waits entry (an empty one too)."""
        with self.lock:
            return bool(self.waits.get(strategy))

    # -- what is in force at step k: DDP's bucket assignment, bucket_cap_mb, events ------------
    def bucket_assignment(self, strategy: str = "ddp", step: int | None = None) -> list | None:
        """Rank 0's bucket assignment in force at `step` (None: the newest):
        [[bucket, [param idx...], bytes], ...]."""
        with self.lock:
            history = self.bucket_assignments.get((strategy, 0))
            if not history:
                return None
            got = history[-1][2] if step is None else in_force([(k, a) for k, _, a in history], step, first=True)
            return _copy(got)

    def bucket_count(self, strategy: str = "ddp", step: int | None = None) -> int:
        """How many buckets bucket_assignment(strategy, step) has (0: none), without its copy."""
        with self.lock:
            history = self.bucket_assignments.get((strategy, 0))
            if not history:
                return 0
            got = history[-1][2] if step is None else in_force([(k, a) for k, _, a in history], step, first=True)
            return len(got)

    def bucket_history(self, strategy: str = "ddp", rank: int = 0) -> list[tuple[int, list]]:
        """Every bucket assignment a rank reported, (step, assignment), oldest first (a new list)."""
        with self.lock:
            return [(k, _copy(a)) for k, _, a in self.bucket_assignments.get((strategy, rank), ())]

    def bucket_reporters(self) -> set[int]:
        """The ranks that reported a bucket assignment (of any strategy)."""
        with self.lock:
            return {r for _s, r in self.bucket_assignments}

    def ddp_reported(self, strategy: str = "ddp", rank: int = 0) -> list[int] | None:
        """The bucket sizes DDP itself last reported on a rank (bytes; None: none reported)."""
        with self.lock:
            got = self.reported_sizes.get((strategy, rank))
            return None if got is None else list(got)

    def collective_tables(self, strategy: str) -> dict[int, dict[int, tuple]]:
        """rank -> its collectives table (id -> (id, op, bytes, group size, group, layer,
        phase, async)), what each COLL span of the strategy was, as the colls frames said (a copy)."""
        with self.lock:
            return {r: dict(t) for (s, r), t in self.collectives.items() if s == strategy}

    def coll_groups(self, strategy: str) -> dict[int, dict[int, tuple[int | None, str]]]:
        """rank -> id -> (the lowest rank of its group, where that is some of the ranks and
        says so, else None; the group's label: 'tp') of the rows of its collectives table on a
        group other than the default one (Store.coll_group_rows); empty for a run without (a copy)."""
        with self.lock:
            return {r: dict(t) for (s, r), t in self.coll_group_rows.items() if s == strategy}

    def rank_coll_groups(self, strategy: str, rank: int) -> dict[int, tuple[int | None, str]]:
        """coll_groups of one rank (a copy; empty: none)."""
        with self.lock:
            return dict(self.coll_group_rows.get((strategy, rank), ()))

    def cap_at(self, step: int) -> float | None:
        """DDP's bucket_cap_mb in force at `step`."""
        with self.lock:
            return in_force(self.cap_changes, step, self.meta.bucket_cap_mb)

    def cap_changed_at(self, upto: int | None = None) -> int:
        """The step of the last bucket_cap_mb change at or before `upto` (0: none)."""
        with self.lock:
            return max((k for k, _ in self.cap_changes if upto is None or k <= upto), default=0)

    def cap_history(self) -> list[tuple[int, float]]:
        """Every bucket_cap_mb change as applied, (step, MB), oldest first (a copy)."""
        with self.lock:
            return list(self.cap_changes)

    def marks(self, strategy: str, step: int) -> list[str]:
        """The texts of the events at a strategy's step (a bucket_cap_mb change, a straggler)."""
        with self.lock:
            return [text for k, s, text in self.events if s == strategy and k == step]

    def layer_sampling(self, strategy: str) -> tuple[int, int] | None:
        """(steps whose layers were marked, steps in all) of a strategy (rank 0's), where some
        steps' layers were not (layer marks on a sample of steps); None where every step's were."""
        with self.lock:
            got = self.layer_marks.get(strategy)
            if not got or not got[1]:
                return None
            return got[0], got[0] + got[1]

    def bucket_timing(self) -> dict | None:
        """How DDP's buckets were timed: {"by": "flight-recorder" | "comm-hook" | "mixed",
        "ranks": {rank: way}, "untimed": buckets NCCL's timing did not cover}; None where no
        rank said (a run before this was recorded, or without DDP)."""
        with self.lock:
            if not self.comm_timing:
                return None
            ways = set(self.comm_timing.values())
            return {"by": ways.pop() if len(ways) == 1 else "mixed",
                    "ranks": {str(r): w for r, w in sorted(self.comm_timing.items())},
                    "untimed": sum(self.fr_untimed.values())}

    def traced_collectives(self) -> dict | None:
        """Functional collectives torch.compile traced into its graphs, which run untimed:
        {op: {"per_step": count a step (rank 0's, else the first rank's), "bytes_per_step",
        "ranks": [ranks that ran them]}}; None where there were none."""
        with self.lock:
            if not self.traced_colls:
                return None
            first = 0 if 0 in self.traced_colls else min(self.traced_colls)
            out = {}
            for op, (n, nb, steps) in sorted(self.traced_colls[first].items()):
                steps = max(1, steps)
                out[op] = {"per_step": round(n / steps, 2), "bytes_per_step": nb // steps,
                           "ranks": sorted(r for r, ops in self.traced_colls.items() if op in ops)}
            return out

    def captured_marks(self) -> dict[str, int] | None:
        """Layer marks skipped in a CUDA graph's capture, by rank; None where there were none."""
        with self.lock:
            return {str(r): n for r, n in sorted(self.graph_marks.items())} or None

    def layer_period(self, strategy: str) -> int | None:
        """The period of layer marks in force (their steps are multiples of it): the gap
        between a strategy's last two marked steps (rank 0's); None where every step's
        layers are marked, or fewer than two steps were."""
        with self.lock:
            lm = self.layer_marks.get(strategy)
            got = self.marked.get(strategy)
            if not lm or not lm[1] or not got or len(got) < 2:
                return None
            a, b = sorted(got)[-2:]
            return b - a

    def view_stamp(self, strategy: str) -> tuple[int, int]:
        """Changes when something that shapes view(strategy, k) besides its spans arrives
        (a bucket assignment of rank 0, an event): a view may be kept while this stays."""
        with self.lock:
            return len(self.bucket_assignments.get((strategy, 0), ())), len(self.events)

    # -- shaped for the readers --------------------------------------------------------------
    def view(self, strategy: str, step: int) -> StepView | None:
        """A step ready to draw (views.step_view): spans per rank, figures, waits, marks."""
        return step_view(self, strategy, step)

    def hta_overlap(self, strategy: str) -> dict[int, float | None]:
        """Per rank, its communication overlapped by compute, as HTA's get_comm_comp_overlap
        reads it from `ddptui export --format kineto` (figures.hta_step): the totals of every
        complete step but the newest (HTA keeps the kernels launched before a trace's last
        ProfilerStep), warm-up included, over all the run's steps (none evicted); with one step
        only, that step. {} when the strategy has no complete step."""
        with self.lock:
            out = {}
            for (s, r), (comm, over, _k, last_comm, last_over) in sorted(self.hta_acc.items()):
                if s != strategy:
                    continue
                if comm - last_comm > 0:
                    comm, over = comm - last_comm, over - last_over
                out[r] = figures.hta_overlap_pct(comm, over)
            return out

    def stalled_steps(self, strategy: str) -> tuple[list[tuple], int]:
        """The steps in which a rank waited hang.STALL_S or more inside one collective (every
        complete step of the run, none evicted): ([(step, step ms, {waiting rank: ms}, the rank
        waited for, kind, idx)], how many more were not kept), by step."""
        with self.lock:
            return sorted(self.stalls.get(strategy, ())), self.stalls_more.get(strategy, 0)

    def stall(self) -> "hang.Stall | None":
        """The collective the ranks are stuck in, as their heartbeats say (model/hang.py), DDP's
        buckets named with their layers (rank 0's newest assignment); None: no rank is stuck."""
        with self.lock:
            if all(i.waiting is None for i in self.ranks.values()):
                return None  # (inside no collective: none stuck; the status line asks every frame)
            layers = list(self.meta.layers)
            assignment = self.bucket_assignment(spec.USER_STRATEGY)
            buckets = hang.bucket_layers(assignment, self.meta.params, layers) if assignment else None
            return hang.stall(self.rank_snapshot(), layers, buckets=buckets)

    def summary(self, strategy: str) -> dict:
        """A strategy's figures as the reports' JSON shapes them (summary.strategy_summary)."""
        return strategy_summary(self, strategy)

    def bucket_rows(self, strategy: str) -> list[dict] | None:
        """Rank 0's newest bucket assignment as {index, params (names), bytes}; None without one."""
        return bucket_rows(self, strategy)

    def summaries(self) -> list[dict]:
        """summary() of every strategy, figures of the steps complete so far made first."""
        self.update()
        return [self.summary(s) for s in self.strategies()]

    # -- samples and the log -----------------------------------------------------------------
    def samples(self) -> tuple[list[dict], list[dict]]:
        """Copies of the kept GPU and CPU samples, oldest first."""
        with self.lock:
            return list(self.gpu), list(self.cpu)

    def log_lines(self) -> list[tuple[float, str, str]]:
        """A copy of the kept log: (time, level, text), oldest first."""
        with self.lock:
            return list(self.log)

    def output_since(self, seq: int) -> tuple[int, list[tuple[float, int, str, str]], int, int]:
        """The ranks' output lines after the reader's sequence number `seq` (0 at first):
        (new seq, those still kept: (time, rank, stream, line), how many of them memory no
        longer holds, lines the run dropped in all (not recorded))."""
        with self.lock:
            new = self.output_seq - seq
            kept = list(self.output)[-new:] if new > 0 else []
            return self.output_seq, kept, max(0, new - len(kept)), self.output_dropped

    def log_since(self, seq: int) -> tuple[int, list[tuple[float, str, str]], int]:
        """The lines logged after the reader's sequence number `seq` (0 at first):
        (new seq, those still kept, how many of them the 500-line log no longer holds)."""
        with self.lock:
            new = self.log_seq - seq
            kept = list(self.log)[-new:] if new > 0 else []
            return self.log_seq, kept, max(0, new - len(kept))
