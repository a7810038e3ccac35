"""A hang, named: the collective the ranks are stuck in, and who never entered it.

Each rank's heartbeat (once a second) says the oldest collective it has entered and not left
(RankInfo.waiting: op, the group's sequence number, bytes, issuing layer, when it was issued
on the rank's host clock) and how many it has entered (colls_entered). `stall(ranks, ...)`
reads them: when a rank has been inside one collective for STALL_S or more (its heartbeat's
time less the issue time: the rank's own clock, no clock across hosts needed), the
collective most of those ranks are inside is THE one; every rank inside it is listed with
how long; a rank that is not is said to have gone past it when its group's sequence number
is (inside a later collective) or, inside none, when it has entered as many as those inside;
any other (inside no collective, or an earlier one, or behind in its count) never entered it.
DDP's bucket AllReduces are collectives like any other here: the heartbeat says the bucket
(RankInfo.waiting_bucket), and the bucket assignment its layers (`bucket_layers`).
Pure: RankInfo copies in, a `Stall` out.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ranks import spec

STALL_S = 3.0  # inside one collective this long, as a heartbeat says: named (beats are 1 s apart)


@dataclass
class Stall:
    op: str
    seq: int
    nbytes: int
    layer: str | None
    inside: dict[int, float]  # rank -> seconds inside it (as of its last heartbeat)
    never: dict[int, str] = field(default_factory=dict)  # rank -> where it is instead
    past: dict[int, str] = field(default_factory=dict)  # rank -> where it went, past it
    bucket: int | None = None  # a DDP bucket's AllReduce: the bucket
    layers: list[str] = field(default_factory=list)  # ... and its layers (the assignment's), if known
    p2p: tuple | None = None  # a pipeline's send or receive: (direction, peer, stage, microbatch)

    def _others(self) -> list[str]:
        """'rank 2 never entered it (...)', 'rank 3 went past it (...)', by rank."""
        said = [(r, f"rank {r} never entered it ({why})") for r, why in self.never.items()]
        said += [(r, f"rank {r} went past it ({why})") for r, why in self.past.items()]
        return [t for _, t in sorted(said)]

    def collective(self) -> str:
        """'all_gather #17 (12.6 MB, h.3)'; a DDP bucket's: 'DDP bucket 0 AllReduce #37
        (1.2 MB, layers fc3, fc2)'."""
        mb = f"{self.nbytes / 1e6:.1f} MB" if self.nbytes >= 1e5 else f"{self.nbytes:,} B"
        if self.bucket is not None:
            where = f"layers {layers_text(self.layers)}" if self.layers else self.layer
            return f"DDP bucket {self.bucket} AllReduce #{self.seq} ({mb}{', ' + where if where else ''})"
        if self.p2p is not None:  # 'recv #12 of microbatch 2's activations from rank 0 (stage 1; 16,384 B)'
            return f"{self.op} #{self.seq} of {p2p_text(self.op, self.p2p)} ({mb})"
        return f"{self.op} #{self.seq} ({mb}{', ' + self.layer if self.layer else ''})"

    def lines(self) -> list[str]:
        """One line per rank: who is inside the collective, who never entered it."""
        what = self.collective()
        out = [f"rank {r} inside {what} for {s:.0f} s" for r, s in sorted(self.inside.items())]
        return out + self._others()

    def text(self) -> str:
        """The whole of it in one line (a log line, the headless output, the status line)."""
        inside = ", ".join(str(r) for r in sorted(self.inside))
        who = f"rank {inside}" if len(self.inside) == 1 else f"ranks {inside}"
        text = f"{who} inside {self.collective()} for {max(self.inside.values()):.0f} s"
        if self.never or self.past:
            text += "; " + "; ".join(self._others())
        return text

    def short(self) -> str:
        """For a status line: 'stuck in AG #17 h.3 12.6 MB: r0 r1 inside 4 s · r2 never entered'."""
        layer = f" {self.layer}" if self.layer else ""
        what = spec.COLL_SHORT.get(self.op, self.op)
        if self.bucket is not None:  # 'stuck in bucket 0 AR #13 (fc3, fc2): ...'
            what = f"bucket {self.bucket} AR"
            names = layers_text(self.layers, 2) if self.layers else self.layer
            layer = f" ({names})" if names else ""
        elif self.p2p is not None:  # 'stuck in RECV #12 (mb 2 from r0): ...'
            _d, peer, _stage, mbn = self.p2p
            layer = f" (mb {mbn} {'from' if self.op == 'recv' else 'to'} r{peer})"
        text = (f"stuck in {what} #{self.seq}{layer}: "
                f"{' '.join(f'r{r}' for r in sorted(self.inside))} inside {max(self.inside.values()):.0f} s")
        if self.never:
            text += f" · {' '.join(f'r{r}' for r in sorted(self.never))} never entered"
        if self.past:
            text += f" · {' '.join(f'r{r}' for r in sorted(self.past))} went past"
        return text


def p2p_text(op: str, p2p: tuple) -> str:
    """"microbatch 2's activations from rank 0 (stage 1)": a pipeline's send or receive."""
    d, peer, stage, mb = p2p
    what = "activations" if d == "forward" else "gradients"
    return f"microbatch {mb}'s {what} {'from' if op == 'recv' else 'to'} rank {peer} (stage {stage})"


def layers_text(names: list[str], most: int = 3) -> str:
    """'fc3, fc2' (up to `most` names), else 'h.11 … h.0 (12)'."""
    if len(names) <= most:
        return ", ".join(names)
    return f"{names[0]} … {names[-1]} ({len(names)})"


def bucket_layers(assignment, params: list, layer_names: list[str]) -> dict[int, list[str]]:
    """Each DDP bucket's layers, in the order of its parameters, from a bucket assignment
    ([[bucket, [param idx...], bytes], ...]) and the params table ([name, elements, layer])."""
    out: dict[int, list[str]] = {}
    for b, ps, _nb in assignment or ():
        names: list[str] = []
        for i in ps:
            li = params[i][2] if 0 <= i < len(params) and len(params[i]) > 2 else -1
            name = layer_names[li] if 0 <= li < len(layer_names) else None
            if name is not None and name not in names:
                names.append(name)
        out[int(b)] = names
    return out


def _where(w: tuple, bucket, layer_names: list[str], p2p: tuple | None = None) -> str:
    """'inside all_gather #17 (h.3)', 'inside DDP bucket 1 AllReduce #38', 'inside send #9
    of microbatch 3's activations to rank 1 (stage 0)'."""
    if bucket is not None:
        return f"inside DDP bucket {bucket} AllReduce #{w[1]}"
    if p2p is not None:
        return f"inside {w[0]} #{w[1]} of {p2p_text(w[0], p2p)}"
    return f"inside {w[0]} #{w[1]}" + (f" ({layer_names[w[3]]})" if 0 <= w[3] < len(layer_names) else "")


def stall(ranks: dict, layer_names: list[str], min_s: float = STALL_S,
          buckets: dict[int, list[str]] | None = None) -> Stall | None:
    """The collective ranks are stuck in (module docstring), or None: no rank has been inside
    one for `min_s`. ranks: rank -> RankInfo (its `waiting`, `waiting_bucket`, `colls_entered`,
    `hb_ts`); buckets: each DDP bucket's layers (`bucket_layers`), if known."""
    stuck = {}
    for r, info in ranks.items():
        w, ts = info.waiting, getattr(info, "hb_ts", None)
        if w is None or ts is None or info.finished or info.exit is not None:
            continue
        secs = (ts - w[4]) / 1e9
        if secs >= min_s:
            stuck[r] = (w, secs)
    if not stuck:
        return None
    # THE collective: the one most stuck ranks are inside (ties: the oldest sequence number)
    votes: dict[tuple, list[int]] = {}
    for r, (w, _) in stuck.items():
        votes.setdefault((w[0], w[1]), []).append(r)
    (op, seq), _ = max(votes.items(), key=lambda kv: (len(kv[1]), -kv[0][1]))
    first_r = next(r for r, (w, _) in stuck.items() if (w[0], w[1]) == (op, seq))
    first = stuck[first_r][0]
    layer = first[3]
    out = Stall(op, seq, first[2], layer_names[layer] if 0 <= layer < len(layer_names) else None, {})
    out.bucket = getattr(ranks[first_r], "waiting_bucket", None)
    out.p2p = getattr(ranks[first_r], "waiting_p2p", None)
    if out.bucket is not None:
        out.layers = list((buckets or {}).get(out.bucket) or [])
    entered = [i.colls_entered for r, i in ranks.items() if i.waiting is not None
               and (i.waiting[0], i.waiting[1]) == (op, seq) and i.colls_entered is not None]
    most = max(entered, default=None)
    for r, info in sorted(ranks.items()):
        w = info.waiting
        if w is not None and (w[0], w[1]) == (op, seq):
            out.inside[r] = (info.hb_ts - w[4]) / 1e9 if getattr(info, "hb_ts", None) else 0.0
            continue
        if info.finished or info.exit is not None:
            continue
        n = info.colls_entered
        count = f"{n} entered" + (f", {most} by those inside" if most is not None and n is not None and n < most else "") \
            if n is not None else "entered count unknown"
        where = "inside no collective" if w is None else \
            _where(w, getattr(info, "waiting_bucket", None), layer_names, getattr(info, "waiting_p2p", None))
        # past it: inside a later one of the group's (its sequence number beyond), or inside
        # none having entered as many as those inside
        past = w[1] > seq if w is not None else (n is not None and most is not None and n >= most)
        (out.past if past else out.never)[r] = f"{where}; {count}"
    return out
