"""A hang named while it happens, from a live job's Flight Recorder polled about once a second
(`ddptui attach`): the collective, who is inside it, who never entered it.

Each poll gives a verdict (model/frverdict.py) of every rank's buffer as it is now. In a
healthy job that verdict is rarely clean: a rank a few milliseconds ahead is inside a
collective the others have not issued yet. `Watch.update(verdict, now_ns, now_s)` therefore
names only what lasts:

- a **desync** at once: a group's first disagreement is another op, other sizes or other
  dtypes (a correct program never shows one, however its ranks are timed);
- a **hang** when a group has a collective that its ranks are inside (or that some never
  issued) for `hang_s` or more by the job's clock (now less when it was first issued), and the
  group made no progress for as long (no rank issued or completed any of its collectives:
  each rank's last issued and last completed, as the verdict says them, unchanged across
  polls; when first seen, since its newest entry): a job whose backend runs ahead of its
  collectives (NCCL's queue) keeps issuing, and is not named.

Of several, the group the verdict names first (its culprit), else the first in flight. The
collective is the group's first disagreement, else its oldest in flight; inside: the ranks
with it in flight (for how long); failed: those where it ended by an error (a timeout, before
the poll); never: the ranks that never issued it; other: what the others issued instead. `update` returns events: ("named", Named) once, ("resolved", Named,
seconds) when the named collective is no longer stuck (it completed: a slow rank, not a hang),
("still", Named) on later polls (its seconds updated). Pure: a verdict and the time in.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .frverdict import FrEntry, GroupVerdict, Verdict, _ranks_text, _rs, _what

HANG_S = 2.0  # inside one collective, with no progress in its group, this long: a hang


@dataclass
class Named:
    """A hang or desync as named (module docstring); `stacks`: each late rank's Python, where
    the caller fetched it ('train.py:11 in stall_here'), and its frames' lines."""
    kind: str  # "hang" | "desync"
    group: str  # the group's label ('default_pg', 'group 1')
    group_name: str
    ranks: list[int]  # the group's ranks
    seq: int
    name: str  # 'all_reduce #66'
    what: str  # 'all_reduce (18,720 B, Float[4680])'
    since_ns: int | None  # when it was first issued (the job's clock): the hang's start
    inside: dict[int, float]  # rank -> seconds inside it, as of the last poll
    never: list[int]
    other: dict[int, str]  # rank -> 'issued broadcast instead', 'other sizes (...)'
    unknown: list[int]
    named_ns: int
    failed: list[int] = field(default_factory=list)  # ranks whose entry of it ended by an error (its timeout)
    stacks: dict[int, str] = field(default_factory=dict)
    stack_lines: dict[int, list[str]] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, int]:
        return self.group_name, self.seq

    @property
    def late(self) -> list[int]:
        """The ranks whose stacks say why: those that never issued it, else those that issued
        something else, else (every rank inside) those inside."""
        return self.never or sorted(self.other) or sorted(self.inside)

    def after_s(self) -> float | None:
        """Seconds from its start to when it was named."""
        return None if self.since_ns is None else max(0.0, (self.named_ns - self.since_ns) / 1e9)

    def line(self) -> str:
        """The whole of it in one line (without the stacks)."""
        bits = []
        if self.inside:
            secs = max(self.inside.values())
            bits.append(f"{_ranks_text(sorted(self.inside))} inside it for {secs:.1f} s")
        if self.failed:
            bits.append(f"{_ranks_text(self.failed)} issued it, ended by an error (its timeout?)")
        if self.never:
            bits.append(f"{_ranks_text(self.never)} never issued it")
        bits += [f"rank {r} {t}" for r, t in sorted(self.other.items())]
        if self.unknown:
            bits.append(f"{_ranks_text(self.unknown)}: unknown (no answer, or its buffer wrapped past it)")
        return f"{self.kind}: {self.group} {_ranks_text(self.ranks, 'ranks')} {self.name} ({self.what.split(' (', 1)[-1]}: " \
            + "; ".join(bits)

    def where_line(self) -> str:
        """'rank 1 at train.py:11 in stall_here' for each late rank whose stack was fetched."""
        return "; ".join(f"rank {r} at {w}" for r, w in sorted(self.stacks.items()) if w)

    def short(self) -> str:
        """For a status line: 'hang: default_pg AR #66: r0 inside 3 s · r1 never issued it ·
        r1 at train.py:11 in stall_here'."""
        bits = []
        if self.inside:
            bits.append(f"{_rs(sorted(self.inside))} inside {max(self.inside.values()):.0f} s")
        if self.never:
            bits.append(f"{_rs(self.never)} never issued it")
        if self.other:
            bits.append(f"{_rs(sorted(self.other))} issued another")
        where = [f"r{r} at {w.split(' (called', 1)[0]}" for r, w in sorted(self.stacks.items()) if w][:2]
        return f"{self.kind}: {self.group} {self.name}: " + " · ".join(bits + where)

    def doc(self) -> dict:
        return {"kind": self.kind, "group": self.group_name, "label": self.group, "ranks": self.ranks,
                "seq": self.seq, "collective": self.name, "what": self.what, "since_ns": self.since_ns,
                "named_ns": self.named_ns, "named_after_s": self.after_s(),
                "inside": {str(r): round(s, 3) for r, s in sorted(self.inside.items())}, "failed": self.failed,
                "never_issued": self.never,
                "other": {str(r): t for r, t in sorted(self.other.items())}, "unknown": self.unknown,
                "stacks": {str(r): {"where": w, "frames": self.stack_lines.get(r, [])} for r, w in sorted(self.stacks.items())}}


@dataclass
class _Progress:
    marker: tuple
    changed_s: float


class Watch:
    """The hang named across polls (module docstring)."""

    def __init__(self, hang_s: float = HANG_S):
        self.hang_s = hang_s
        self.current: Named | None = None
        self._progress: dict[str, _Progress] = {}

    def _quiet_s(self, g: GroupVerdict, now_ns: int, now_s: float) -> float:
        """Seconds the group made no progress (module docstring)."""
        marker = tuple(sorted((r, a.last_issued, a.last_done.record_id if a.last_done else None, len(a.in_flight))
                              for r, a in g.at.items()))
        got = self._progress.get(g.name)
        if got is None:
            newest = [t for a in g.at.values() for e in ([a.last_done] if a.last_done else []) + a.in_flight
                      for t in (e.created_ns, e.started_ns, e.completed_ns) if t]
            idle = max(0.0, (now_ns - max(newest)) / 1e9) if newest else 0.0
            got = self._progress[g.name] = _Progress(marker, now_s - idle)
        elif got.marker != marker:
            got.marker, got.changed_s = marker, now_s
        return now_s - got.changed_s

    def _candidate(self, g: GroupVerdict, now_ns: int) -> Named | None:
        """The group's stuck collective as a Named (not yet judged), or None."""
        d = g.first
        flying = {r: [e for e in es] for r, es in g.in_flight.items()}
        if d is not None:
            seq, ref = d.seq, d.ref
            p2p = False
        else:
            colls = [e for es in flying.values() for e in es if not e.p2p]
            pick = colls or [e for es in flying.values() for e in es]
            if not pick:
                return None
            ref = min(pick, key=lambda e: (e.seq, e.created_ns or 0))
            seq, p2p = ref.seq, ref.p2p
        mine = {r: [e for e in es if e.seq == seq and e.p2p == p2p] for r, es in flying.items()}
        mine = {r: es for r, es in mine.items() if es}
        starts = [e.created_ns for es in mine.values() for e in es if e.created_ns]
        since = min(starts) if starts else ref.created_ns
        inside = {r: max(0.0, (now_ns - min(e.created_ns or now_ns for e in es)) / 1e9) for r, es in mine.items()}
        other: dict[int, str] = {}
        never, unknown = [], []
        kind = "hang"
        failed = sorted(r for r, a in g.at.items() if any(e.seq == seq and e.p2p == p2p for e in a.failed))
        if d is not None:
            never, unknown = list(d.never), list(d.unknown)
            for r, e in d.other_op.items():
                other[r] = f"issued {e.op} instead"
            for r, e in d.other_sizes.items():
                other[r] = f"issued other sizes ({_sizes(e)})"
            for r, e in d.other_dtypes.items():
                other[r] = f"issued other dtypes ({', '.join(e.in_dtypes)})"
            if d.other_op or d.other_sizes or d.other_dtypes:
                kind = "desync"
        return Named(kind, g.label, g.name, list(g.ranks), seq, ref.name, _what(ref), since, inside,
                     never, other, unknown, now_ns, failed)

    def update(self, verdict: Verdict, now_ns: int, now_s: float) -> list[tuple]:
        """This poll's events (module docstring). now_ns: the wall clock (the job's clock, as
        its entries' times are); now_s: a monotonic clock (progress between polls)."""
        culprit = verdict.culprit()
        order = ([culprit] if culprit is not None else []) + [g for g in verdict.groups if g is not culprit]
        stuck: Named | None = None
        for g in order:
            quiet = self._quiet_s(g, now_ns, now_s)
            c = self._candidate(g, now_ns)
            if c is None or stuck is not None:
                continue
            age = (now_ns - c.since_ns) / 1e9 if c.since_ns else 0.0
            if c.kind == "desync" or (age >= self.hang_s and quiet >= self.hang_s):
                stuck = c
        events: list[tuple] = []
        cur = self.current
        if cur is not None and (stuck is None or stuck.key != cur.key):
            secs = (now_ns - cur.since_ns) / 1e9 if cur.since_ns else 0.0
            events.append(("resolved", cur, secs))
            self.current = cur = None
        if stuck is not None:
            if cur is None:
                self.current = stuck
                events.append(("named", stuck))
            else:  # the same one: its seconds and who is inside, as of now
                cur.inside, cur.never, cur.other = stuck.inside, stuck.never, stuck.other
                cur.unknown, cur.failed = stuck.unknown, stuck.failed
                events.append(("still", cur))
        return events


def _sizes(e: FrEntry) -> str:
    return f"in {[list(s) for s in e.in_sizes]}, out {[list(s) for s in e.out_sizes]}"
