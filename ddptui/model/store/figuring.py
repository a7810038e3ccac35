"""The Store's figuring, one job: figures of complete steps. `update()` computes the figures
of the steps every rank has sent (per rank, per step, who waited for whom, the step's
interval; multi-node, each collective's clock sample) and evicts what is beyond the Store's
bounds; `rank_figures` and `bucket_figures` make a step's per-rank and per-bucket figures
when first asked for. Works on the Store's state (declared in store/__init__.py); frames
come in through intake.py, readers go through queries.py.

What to compute is chosen under the lock, computed outside it (span batches never change
once in) and published under it, so readers (the UI) never wait on the arithmetic."""
from __future__ import annotations

from collections import OrderedDict, deque

from .. import columnwise
from .. import figures
from .. import stragglers
from ..clocksync import KEEP_COLLECTIVES, coll_sample
from ..hang import STALL_S

STALL_MS = STALL_S * 1e3  # a step in which a rank waited this long inside one collective: a stall
STALLS_KEPT = 100  # stalled steps listed per strategy (the rest counted)
from .history import in_force, in_force_span


class Figuring:
    """Figures of complete steps, and eviction (a part of Store: the state it works on is
    declared in Store.__init__)."""

    def comm_bytes_fn(self, strategy: str, rank: int, step: int):
        """idx -> bytes of a rank's AllReduce at `step`: DDP, the bucket's size in the bucket
        assignment in force; other strategies, the parameter's gradient bytes."""
        history = self.bucket_assignments.get((strategy, rank))
        if strategy == "ddp" and history:
            # the same lookup while the same assignment is in force (one a rank and step, at
            # 1,024 ranks ten steps a second, otherwise)
            got = self._bytes_fns.get((strategy, rank))
            if got is not None and got[0] == len(history) and got[1] <= step < got[2]:
                return got[3]
            i, lo, hi = in_force_span(history, step)
            sizes = history[i][1]
            fn = (lambda x, _g=sizes.get: _g(x, 0))
            self._bytes_fns[(strategy, rank)] = (len(history), lo, hi, fn)
            return fn
        pb = self._param_bytes
        return lambda i: pb[i] if i < len(pb) else 0

    def coll_row_fn(self, strategy: str, rank: int):
        """idx -> the row of a rank's collectives table a COLL span names (None: none such:
        counted, without bytes), or None when the rank sent no table. (Under the lock: a copy,
        the figures are made outside it.)"""
        table = self.collectives.get((strategy, rank))
        if not table:
            return None
        got = self._row_fns.get((strategy, rank))
        if got is not None and got[0] == len(table):  # (rows are only ever added)
            return got[1]
        fn = dict(table).get
        self._row_fns[(strategy, rank)] = (len(table), fn)
        return fn

    def _rank_step(self, b, strategy: str, rank: int, step: int) -> figures.RankStep:
        return figures.rank_step(b, self.comm_bytes_fn(strategy, rank, step), self.coll_row_fn(strategy, rank),
                                 self.expected_ranks(strategy))

    def rank_figures(self, strategy: str, step: int, rank: int) -> figures.RankStep | None:
        with self.lock:
            key = (strategy, step, rank)
            got = self.rank_figs.get(key)
            if got is None:
                b = self.raw.get(strategy, {}).get(step, {}).get(rank)
                if b is None:
                    return None
                got = self.rank_figs[key] = self._rank_step(b, strategy, rank, step)
            return got

    def bucket_figures(self, strategy: str, step: int) -> dict[int, tuple[float, float | None]] | None:
        """Per AllReduce index (DDP: bucket) of a step: (mean time ms, mean % overlapped with
        compute) over its ranks (figures.bucket_step); kept once the step is complete. Made
        outside the lock (batches never change once in): ingest does not wait on it."""
        key = (strategy, step)
        with self.lock:
            got = self.bucket_figs.get(key)
            if got is not None:
                return got
            ranks = self.raw.get(strategy, {}).get(step)
            if not ranks:
                return None
            batches, complete = list(ranks.values()), len(ranks) >= self.expected_ranks(strategy)
        got = columnwise.bucket_step(batches)
        if got is None:  # (ranks with different columns: rank by rank)
            got = figures.bucket_step(batches)
        if complete:
            with self.lock:
                if self.raw.get(strategy, {}).get(step) is not None:  # (not evicted meanwhile)
                    self.bucket_figs[key] = got
        return got

    def update(self) -> None:
        """Compute figures of steps complete on every rank; evict what is beyond bounds.

        Three phases, so readers (the UI) never wait on the arithmetic: what to compute is
        chosen under the lock, computed outside it (span batches never change once in), and
        published under it (a step evicted meanwhile is dropped). The Updater thread calls
        this while a run is live; readers that need figures now may call it too."""
        # (strategy, step, {rank: batch}, {rank: (comm_bytes, coll_row)}, ranks in the ring,
        # {rank: {row id: (its group's lowest rank, its label)}} or None: stragglers.split_by_group)
        todo = []
        with self.lock:
            for strategy, dirty in self._dirty.items():
                per = self.raw.get(strategy, {})
                want = self.expected_ranks(strategy)
                figs = self.step_figs.get(strategy, {})
                for k in sorted(dirty):
                    ranks = per.get(k)
                    if ranks is None or len(ranks) < want or k in figs:
                        continue
                    inst = self.coll_group_rows
                    inst = {r: dict(inst[(strategy, r)]) for r in ranks if (strategy, r) in inst} if inst else None
                    todo.append((strategy, k, dict(sorted(ranks.items())),
                                 {r: (self.comm_bytes_fn(strategy, r, k), self.coll_row_fn(strategy, r))
                                  for r in ranks}, want, inst))
                    dirty.discard(k)
        done = []
        for strategy, k, ranks, comm, want, inst in todo:
            place = columnwise.usable(ranks)
            if place is not None:  # every rank the same columns: all ranks at once (numpy)
                sk = columnwise.Stacked(ranks, place)
                rs = columnwise.rank_steps(sk, comm, want)
                for r, b in ranks.items():  # (a rank whose compute waited for a collective:
                    if b.waits:  # its compute less the waits, as figures.rank_step has it)
                        rs[r] = figures.rank_step(b, *comm[r], want)
                hta = columnwise.hta_steps(sk, rs)
                step = figures.combine(k, list(rs.values()))
                waits = columnwise.step_waits(sk, step.step_ms, inst)
                if waits is not None and place.layered and len(sk.ranks) >= columnwise.EAGER_EVIDENCE_FROM:
                    waits.set_evidence(columnwise.sections_excess(ranks, sk))
            else:
                rs = {r: figures.rank_step(b, *comm[r], want) for r, b in ranks.items()}
                hta = {r: figures.hta_step(ranks[r], got) for r, got in rs.items()}
                step = figures.combine(k, list(rs.values()))
                waits = stragglers.step_waits(ranks, step.step_ms, groups=inst)
            done.append((strategy, k, ranks, rs, step, waits, figures.step_interval(ranks.values()), hta))
        with self.lock:
            for strategy, k, ranks, rs, step, waits, interval, hta in done:
                if self.raw.get(strategy, {}).get(k) is None:
                    continue  # evicted while computed
                figs = self.step_figs.setdefault(strategy, OrderedDict())
                if k in figs:
                    continue  # another caller published it first
                for r, got in rs.items():
                    self.rank_figs[(strategy, k, r)] = got
                for r, (comm_ms, over_ms) in hta.items():
                    acc = self.hta_acc.setdefault((strategy, r), [0.0, 0.0, -1, 0.0, 0.0])
                    acc[0] += comm_ms
                    acc[1] += over_ms
                    if k > acc[2]:
                        acc[2:] = [k, comm_ms, over_ms]
                figs[k] = step
                if interval is not None:
                    self._intervals[(strategy, k)] = interval
                self.waits.setdefault(strategy, OrderedDict())[k] = waits
                if waits is not None and waits.wait_ms and max(waits.wait_ms.values()) >= STALL_MS:
                    self._note_stall(strategy, k, step.step_ms, waits)
                if waits is not None and self.clocks:
                    self._collect_clock_samples(waits, self._shift.get((strategy, k), {}), (strategy, k))
            if done:
                self.version += 1
            self._evict()

    def _note_stall(self, strategy: str, k: int, step_ms: float, w: stragglers.StepWaits) -> None:
        """(Under the lock.) A step in which a rank waited STALL_MS or more: its collective with
        the longest wait, the ranks that waited in it (half that wait or more) and for whom."""
        best, who = None, None
        for c in w.collectives:
            for r in c.ready:
                ns = c.wait_ns(r)
                if best is None or ns > best[0]:
                    best, who = (ns, c), r
        if best is None:
            return
        ns, c = best
        waited = {r: c.wait_ns(r) / 1e6 for r in sorted(c.ready) if c.wait_ns(r) >= ns / 2}
        got = self.stalls.setdefault(strategy, [])
        if len(got) >= STALLS_KEPT:
            self.stalls_more[strategy] = self.stalls_more.get(strategy, 0) + 1
            return
        got.append((k, step_ms, waited, c.last, c.kind, c.idx))

    def _evict(self) -> None:
        """(Under the lock.) Raw spans and what is kept per step with them beyond the last
        `keep_steps` steps of each strategy, step figures beyond the last `keep_figures`.
        Where layers are marked on a sample of steps, the last 2 x stragglers.RECENT complete
        marked steps stay (`_stays`; `stays`: those past the window of the last steps): the
        oldest step evicted is the oldest of the others."""
        for strategy, dirty in self._dirty.items():
            per = self.raw.get(strategy, {})
            figs = self.step_figs.setdefault(strategy, OrderedDict())
            lm = self.layer_marks.get(strategy)
            stay = self._stays(strategy) if lm is not None and lm[1] else None
            while len(per) > self.keep_steps:
                if stay:
                    k = next((j for j in per if j not in stay), None)
                    if k is None:
                        break
                    ranks = per.pop(k)
                else:
                    k, ranks = per.popitem(last=False)
                self._shift.pop((strategy, k), None)
                self.waits.get(strategy, {}).pop(k, None)
                self.bucket_figs.pop((strategy, k), None)
                self._intervals.pop((strategy, k), None)
                for r in ranks:
                    self.rank_figs.pop((strategy, k, r), None)
                dirty.discard(k)
            # those kept past the window of the last steps (older than its oldest)
            past = frozenset()
            if stay:
                floor = next((j for j in per if j not in stay), None)
                past = frozenset(k for k in stay if floor is None or k < floor)
            self.stays[strategy] = past
            while len(figs) > self.keep_figures:
                figs.popitem(last=False)

    def _stays(self, strategy: str) -> frozenset:
        """(Under the lock.) The steps that stay past keep_steps: the last 2 x stragglers.RECENT
        marked steps that are complete with a who-waits entry (what the per-layer evidence
        judges, RECENT of them up to the step on screen, which may be behind the newest; a
        marked step one rank's frame never completed does not count)."""
        waits = self.waits.get(strategy, {})
        got: list[int] = []
        for k in reversed(self.marked.get(strategy, ())):
            if k > 0 and waits.get(k) is not None:
                got.append(k)
                if len(got) == 2 * stragglers.RECENT:
                    break
        return frozenset(got)

    def _collect_clock_samples(self, w: stragglers.StepWaits, shift: dict[int, int], step: tuple) -> None:
        """Multi-node: each collective of a step, per host against node 0, in raw host times
        (what the clock refinement reads; ddptui/model/clocksync.py)."""
        by_node: dict[int, list[int]] = {}
        for r in shift:
            by_node.setdefault(self.node_of.get(r, 0), []).append(r)
        here = by_node.pop(0, None)
        if not here or not by_node:
            return
        for c in w.collectives:
            if c.group is not None:  # (one group of a mesh dimension's: not every host's)
                continue
            r0, e0 = [c.ready[r] for r in here], [c.end[r] for r in here]
            for node, rs in by_node.items():
                got = self._coll.get(node)
                if got is None:
                    got = self._coll[node] = deque(maxlen=KEEP_COLLECTIVES)
                got.append(coll_sample(r0, e0, [c.ready[r] + shift[r] for r in rs],
                                       [c.end[r] + shift[r] for r in rs], step))
