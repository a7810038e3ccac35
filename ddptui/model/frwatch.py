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
  polls; since the newest moment its entries hold, and at most since the poll before the
  one that saw it change, so that polls seconds apart add nothing to the time it takes): a
  job whose backend runs ahead of its collectives (NCCL's queue) keeps issuing, and is not
  named.

Point-to-point ops the same way, as the verdict pairs them (`GroupVerdict.p2p`: a group's
sends with their recvs per (src, dst)): a **hang** when a recv that no send answers (or a send
that no recv answers) is still in flight on its rank for `hang_s` with no progress in its
group; a **desync** when a send and its recv have other sizes or dtypes: at once where the
pair's place is known, else once it lasts as a hang does (a buffer that wrapped pairs them
from the last that ended on both sides, which polls of two ranks at other moments can shift).
A send that went on without its recv (NCCL sends small ones eagerly) waits on no one: not named.

Of several, the first that lasts, in the verdict's order (`Verdict.lead`): the point-to-point
ones first where the verdict leads with one (the root of a chain of waiting stages first: a
rank that never issued a collective because it waits in a recv), else the group the verdict
names first (its culprit), the first in flight, then the point-to-point ones. The collective
is the group's first disagreement, else its oldest in flight; inside: the ranks with it in
flight (for how long); failed: those where it ended by an error (a timeout, before the poll);
never: the ranks that never issued it; other: what the others issued instead. A
point-to-point one is named by what waits ('recv 0->1 #7': rank 1's 7th send or recv, waiting
for rank 0's send), inside: the rank waiting in it; never: the rank that never sent it (or
never posted its recv): the one whose stack says why. `update` returns events: ("named",
Named) once, ("resolved", Named, seconds) when the named collective is no longer stuck (it
completed: a slow rank, not a hang), ("still", Named) on later polls (its seconds updated).
Pure: a verdict and the time in.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .frverdict import (FrEntry, GroupVerdict, P2PIssue, Verdict, _ordinal, _p2p_doc, _p2p_order, _ranks_text,
                        _rs, _shape_of, _what)

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
    issue: P2PIssue | None = None  # a point-to-point one: the send and recv that do not match

    @property
    def pair(self) -> str:
        """'0->1' for a point-to-point one, '' for a collective."""
        return self.issue.pair if self.issue is not None else ""

    @property
    def key(self) -> tuple[str, int, str]:
        return self.group_name, self.seq, self.pair

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
        if self.issue is not None:
            return self._p2p_line()
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
        return self._head() + "; ".join(bits)

    def _p2p_line(self) -> str:
        i = self.issue
        bits = []
        if self.inside:
            bits.append(f"{_ranks_text(sorted(self.inside))} waiting in it for {max(self.inside.values()):.1f} s")
        if i.kind == "no_send":
            count = f" (the {_ordinal(i.index)}; rank {i.src} sent {i.sent})" if i.index else ""
            bits.append(f"rank {i.src} never sent it{count}")
        elif i.kind == "no_recv":
            count = f" (the {_ordinal(i.index)}; rank {i.dst} posted {i.posted})" if i.index else ""
            bits.append(f"rank {i.dst} never posted its recv{count}")
        else:
            nth = f"; the {_ordinal(i.index)} from rank {i.src} to rank {i.dst}" if i.index else ""
            bits.append(f"rank {i.src} {self.other[i.src]}, rank {i.dst} {self.other[i.dst]} (other {i.kind}{nth})")
        if i.peer_at:
            bits.append(f"rank {i.culprit}: {i.peer_at}")
        if i.cycle:
            bits.append(f"a cycle: {_ranks_text(i.cycle)} each wait for another of them")
        return self._head() + "; ".join(bits)

    def _head(self) -> str:
        """'hang: default_pg [ranks 0, 1] all_reduce #66 (18,720 B, Float[4680]): '."""
        what = self.what.split(" (", 1)[-1]
        return f"{self.kind}: {self.group} {_ranks_text(self.ranks, 'ranks')} {self.name} ({what}: "

    def where_line(self) -> str:
        """'rank 1 at train.py:11 in stall_here' for each late rank whose stack was fetched."""
        return "; ".join(f"rank {r} at {w}" for r, w in sorted(self.stacks.items()) if w)

    def short(self) -> str:
        """For a status line: 'hang: default_pg AR #66: r0 inside 3 s · r1 never issued it ·
        r1 at train.py:11 in stall_here', 'hang: default_pg recv 0->1 #7: r1 waiting 6 s · r0
        never sent it · r0 at train.py:11 in stall_here'."""
        bits = []
        i = self.issue
        if self.inside:
            bits.append(f"{_rs(sorted(self.inside))} {'waiting' if i is not None else 'inside'} "
                        f"{max(self.inside.values()):.0f} s")
        if self.never:
            said = ("never issued it" if i is None else "never sent it" if i.kind == "no_send"
                    else "never posted its recv")
            bits.append(f"{_rs(self.never)} {said}")
        if self.other:
            bits.append(f"{_rs(sorted(self.other))} " + (f"other {i.kind}" if i is not None else "issued another"))
        where = [f"r{r} at {w.split(' (called', 1)[0]}" for r, w in sorted(self.stacks.items()) if w][:2]
        return f"{self.kind}: {self.group} {self.name}: " + " · ".join(bits + where)

    def doc(self) -> dict:
        return {"kind": self.kind, "group": self.group_name, "label": self.group, "ranks": self.ranks,
                "seq": self.seq, "collective": self.name, "what": self.what, "since_ns": self.since_ns,
                "named_ns": self.named_ns, "named_after_s": self.after_s(),
                "inside": {str(r): round(s, 3) for r, s in sorted(self.inside.items())}, "failed": self.failed,
                "never_issued": self.never,
                "other": {str(r): t for r, t in sorted(self.other.items())}, "unknown": self.unknown,
                "stacks": {str(r): {"where": w, "frames": self.stack_lines.get(r, [])} for r, w in sorted(self.stacks.items())},
                "point_to_point": _p2p_doc(self.issue) if self.issue is not None else None}


@dataclass
class _Progress:
    marker: tuple
    changed_s: float
    polled_s: float


class Watch:
    """The hang named across polls (module docstring)."""

    def __init__(self, hang_s: float = HANG_S):
        self.hang_s = hang_s
        self.current: Named | None = None
        self._progress: dict[str, _Progress] = {}
        # the longest any collective not (yet) named has stood stuck, as of the last update:
        # inside it (or never issued by some rank) this long, with no progress in its group
        # for as long (0: none); `ddptui attach` polls sooner while it is over a moment
        self.pending_s = 0.0

    def _quiet_s(self, g: GroupVerdict, now_ns: int, now_s: float) -> float:
        """Seconds the group made no progress (module docstring)."""
        marker = tuple(sorted((r, a.last_issued, a.last_done.record_id if a.last_done else None, len(a.in_flight))
                              for r, a in g.at.items()))
        got = self._progress.get(g.name)
        if got is None or got.marker != marker:
            # progress seen (or the group first seen): since the newest moment its entries hold,
            # not since this poll (polls a few seconds apart would otherwise add their gap to
            # the time a hang takes to be named)
            newest = [t for a in g.at.values() for e in ([a.last_done] if a.last_done else []) + a.in_flight
                      for t in (e.created_ns, e.started_ns, e.completed_ns) if t]
            idle = max(0.0, (now_ns - max(newest)) / 1e9) if newest else 0.0
            if got is not None:  # (it progressed after the last poll)
                idle = min(idle, now_s - got.polled_s)
            got = self._progress[g.name] = _Progress(marker, now_s - idle, now_s)
        got.polled_s = now_s
        return now_s - got.changed_s

    def _candidate(self, g: GroupVerdict, now_ns: int, p2p_too: bool = True) -> Named | None:
        """The group's stuck collective as a Named (not yet judged), or None. `p2p_too`: its
        oldest send or recv in flight where no collective is (False: the group's sends and
        recvs are judged as pairs, `_p2p_candidate`)."""
        d = g.first
        flying = {r: [e for e in es] for r, es in g.in_flight.items()}
        if d is not None:
            seq, ref = d.seq, d.ref
            p2p = False
        else:
            colls = [e for es in flying.values() for e in es if not e.p2p]
            pick = colls or ([e for es in flying.values() for e in es] if p2p_too else [])
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

    def _p2p_candidate(self, g: GroupVerdict, i: P2PIssue, now_ns: int) -> Named | None:
        """A send and recv that do not match as a Named (not yet judged), or None where no rank
        waits in it (a send that went on without its recv)."""
        flying = {id(e) for a in g.at.values() for e in a.in_flight}
        if i.culprit is not None and id(i.entry) not in flying:
            return None
        e = i.entry
        inside = {r: max(0.0, (now_ns - (x.created_ns or now_ns)) / 1e9)
                  for r, x in ((i.src, i.send), (i.dst, i.recv)) if x is not None and id(x) in flying}
        other: dict[int, str] = {}
        if i.culprit is None:  # (other sizes or dtypes: both issued it)
            other = {i.src: f"sent {_shapes(i.send, False)}",  # type: ignore[arg-type]
                     i.dst: f"posted its recv for {_shapes(i.recv, True)}"}  # type: ignore[arg-type]
        kind = "desync" if i.culprit is None else "hang"
        side = "recv" if i.kind == "no_send" else "send"
        return Named(kind, g.label, g.name, list(g.ranks), e.seq, f"{side} {i.pair} #{e.seq}", _what(e),
                     e.created_ns, inside, [i.culprit] if i.culprit is not None else [], other, [], now_ns,
                     issue=i)

    def update(self, verdict: Verdict, now_ns: int, now_s: float) -> list[tuple]:
        """This poll's events (module docstring). now_ns: the wall clock (the job's clock, as
        its entries' times are); now_s: a monotonic clock (progress between polls)."""
        culprit = verdict.culprit()
        order = ([culprit] if culprit is not None else []) + [g for g in verdict.groups if g is not culprit]
        quiet = {g.name: self._quiet_s(g, now_ns, now_s) for g in order}
        pairs: list[tuple[P2PIssue, Named]] = []  # each group's first send or recv that waits (or mismatch)
        for g in verdict.groups:
            for i in g.p2p:
                c = self._p2p_candidate(g, i, now_ns)
                if c is not None:
                    pairs.append((i, c))
                    break
        pairs.sort(key=lambda x: _p2p_order(x[0]))
        paired = {c.group_name for _, c in pairs}
        colls = [c for g in order for c in [self._candidate(g, now_ns, g.name not in paired)] if c is not None]
        lead = verdict.lead()
        p2ps = [c for _, c in pairs]
        stuck: Named | None = None
        self.pending_s = 0.0
        for c in (p2ps + colls if lead is not None and lead[0] == "p2p" else colls + p2ps):
            age = (now_ns - c.since_ns) / 1e9 if c.since_ns else 0.0
            at_once = c.kind == "desync" and (c.issue is None or c.issue.index is not None)
            if at_once or (age >= self.hang_s and quiet[c.group_name] >= self.hang_s):
                stuck = c
                break
            self.pending_s = max(self.pending_s, min(age, quiet[c.group_name]))
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
                cur.unknown, cur.failed, cur.issue = stuck.unknown, stuck.failed, stuck.issue
                events.append(("still", cur))
        return events


def _sizes(e: FrEntry) -> str:
    return f"in {[list(s) for s in e.in_sizes]}, out {[list(s) for s in e.out_sizes]}"


def _shapes(e: FrEntry, out: bool) -> str:
    """A send's shapes (its inputs), a recv's (its outputs): 'Float[4, 16]'."""
    sizes, dtypes = _shape_of(e, out)
    return ", ".join(f"{dt}{list(sz)}" for sz, dt in zip(sizes, dtypes)) or "no shape recorded"
