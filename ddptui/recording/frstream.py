"""A live job's Flight Recorder, polled (`ddptui attach`), as frames: the same run a directory of
dumps makes (recording/frdump.py: strategy ``ddp``, a lane per rank, every collective a COLL
span labelled with its op and process group, the groups as the run's "layers"), made as the
polls come.

Each poll hands `FrStream.poll` every rank's buffer as it is now (RankDumps) and their verdict.
A collective (every rank's entries of one group's sequence number) is drawn once it is
*settled*: ended on every rank that holds it, and issued by every rank of its group that
answered (a rank whose buffer no longer reaches back to it does not count). The settled
ones not drawn yet, in the order they were first issued, are cut into the job's own steps
(`frdump.job_steps`: where they repeat with a period, a period a step, cut where the job
paused longest; a last step not yet whole waits for the next poll; with no period, STEP_COLLS
a step), so every step the buffers still hold is drawn, however many the job made between
two polls (up to DRAWN_MAX of them a poll: past that, several of the job's steps to a drawn
step, said).
While a hang is named (`hung`), the collectives not settled are drawn too, in flight up to
this poll's moment, in a step of their own that is sent again at every poll (it grows as
the hang lasts; a rank that never issued one has no bar there), after the settled ones that
came before it (as steps of their own), and that takes the settled ones that come meanwhile;
when the hang ends it is sent a last time as an ordinary step.

Memory: what is kept is bounded by the ranks' buffers (the keys of the collectives drawn,
only while some buffer still holds them; each rank's table of rows, at most 0xFFFF), never
by how long the job runs. Times: the hosts' wall clocks, from `origin_ns` (the first poll's
oldest entry), so every rank is on one axis.
"""
from __future__ import annotations

from ranks import frames

from ddptui.model import frverdict
from .frdump import MODEL, STRATEGY, coll_row, job_steps, span_of, step_frames

STEP_COLLS = 32
# the job's steps drawn a poll at most: where it made more since the last poll (a host-bound job
# of a few ms a step: hundreds), consecutive ones are drawn together, as few to a drawn step as
# keeps it within this (`per_drawn`, said), so that nothing is left out and the app's work a
# poll stays bounded
DRAWN_MAX = 32
MAX_GROUPS = 256  # process groups given a "layer" of their own (later ones: drawn unlabelled)


class FrStream:
    """Frames of a job's Flight Recorder over successive polls (module docstring)."""

    def __init__(self, world: int, origin_ns: int, backend: str = "", devices: dict[int, str] | None = None,
                 notes: dict[int, str] | None = None):
        self.world = world
        self.origin = origin_ns
        self.backend = backend
        self.devices = dict(devices or {})
        self.notes = dict(notes or {})  # rank -> why it has no debug server (said in its hello)
        self.said_layers = -1  # the layers the last hello carried (-1: no hello yet)
        self.layers: list[str] = []  # each process group's label, by index (grows)
        self.group_index: dict[str, int] = {}
        self.tables: dict[int, dict[tuple, int]] = {r: {} for r in range(world)}
        self.drawn: set[tuple] = set()  # keys (group, p2p, seq) drawn, while a buffer holds them
        # group -> (the highest seq, the latest creation) of its collectives drawn and no longer
        # held by any buffer read: a settled collective at or below both is not drawn again
        # when a rank's older entries come back into view (a rank answering again after missed
        # polls, its buffer read whole: ddptui attach). Collectives only (point-to-point
        # numbers are each rank's own); a group made again under its name, its numbers from 1,
        # is newer than both. `drawn_at`: a drawn key's first creation.
        self.gone: dict[str, tuple[int, int]] = {}
        self.drawn_at: dict[tuple, int] = {}
        self.step = 0  # the next step's number
        self.open: list = []  # settled keys in the hang's step (sent again each poll); [None]: open, none yet
        self.steps = 0  # steps finished (sent as ordinary steps)
        self.last_settled = 0  # collectives settled in the last poll (0: the job did none)
        self.per_drawn = 1  # the job's steps in a drawn step at the last poll (DRAWN_MAX)

    def _hellos(self) -> list:
        """Every rank's hello and phase, before the first step; later, when a process group
        is new, rank 0's hello again with the groups as they are now (a run's layers are
        what its hellos say: a recording replays them so)."""
        ranks = range(self.world) if self.said_layers < 0 else [0]
        self.said_layers = len(self.layers)
        out = []
        for r in ranks:
            note = self.notes.get(r, "")
            out.append(frames.Hello(rank=r, world=self.world, device=self.devices.get(r, "cpu"),
                                    backend=self.backend[:16], model=MODEL, layers=list(self.layers), params=[],
                                    strategies=[STRATEGY], steps=0, note=note[:4000]))
            out.append(frames.Phase(rank=r, phase="no debug server" if note else "attached"))
        return out

    def _index(self, g: frverdict.GroupVerdict) -> int:
        i = self.group_index.get(g.name)
        if i is None:
            if len(self.layers) >= MAX_GROUPS:
                return -1
            i = self.group_index[g.name] = len(self.layers)
            self.layers.append(g.label[:64])
        return i

    def poll(self, dumps: dict[int, frverdict.RankDump], verdict: frverdict.Verdict, now_ns: int,
             hung: bool) -> list:
        """This poll's frames (module docstring): a hello first where a group is new."""
        groups = {g.name: g for g in verdict.groups}
        for g in verdict.groups:
            self._index(g)
        out: list = self._hellos() if len(self.layers) != self.said_layers else []
        flying, failed = verdict.states()
        by_key: dict[int, dict[tuple, list]] = {}
        first: dict[tuple, int] = {}
        for r, d in dumps.items():
            mine = by_key[r] = {}
            for e in d.entries:
                key = (e.group, e.p2p, e.seq)
                mine.setdefault(key, []).append(e)
                t = e.created_ns or 0
                if key not in first or t < first[key]:
                    first[key] = t
        held = first.keys()
        drawn_at, gone = self.drawn_at, self.gone
        for key in self.drawn - held:  # (bounded: only what some buffer still holds)
            t = drawn_at.pop(key, 0)
            if not key[1]:
                seq0, t0 = gone.get(key[0], (-1, 0))
                gone[key[0]] = (max(seq0, key[2]), max(t0, t))
        self.drawn &= held
        settled, pending = [], []
        for key in sorted(first, key=lambda k: (first[k], k)):
            if key in self.drawn:
                continue
            if self._settled(key, dumps, by_key, groups, flying):
                g = gone.get(key[0]) if not key[1] else None
                if g is not None and key[2] <= g[0] and first[key] <= g[1]:
                    continue  # (drawn before: its entries back into view)
                settled.append(key)
            else:
                pending.append(key)
        self.last_settled = len(settled)
        carry = [k for k in self.open if k is not None and k in first] + settled
        if hung and not self.open:  # a hang just named: what settled before it first, as steps
            while carry:
                chunk, carry = carry[:STEP_COLLS], carry[STEP_COLLS:]
                out += self._step(chunk, dumps, by_key, groups, flying, failed, now_ns)
                self.drawn.update(chunk)
                drawn_at.update((k, first[k]) for k in chunk)
                self.step += 1
                self.steps += 1
        self.open = []
        if not hung:  # the job's own steps, each drawn as one (a last one not yet whole: next poll)
            def sig(key):
                for r in by_key:
                    es = by_key[r].get(key)
                    if es:
                        e = es[0]
                        return key[0], key[1], e.op, e.in_sizes, e.in_dtypes
                return key[0], key[1]
            chunks, _ = job_steps(carry, sig, first.get, STEP_COLLS, hold_tail=bool(pending))
            carry = []
            per = max(1, -(-len(chunks) // DRAWN_MAX))  # (ceil; a poll with none: 1)
            self.per_drawn = per
            if per > 1:
                chunks = [[k for c in chunks[i:i + per] for k in c] for i in range(0, len(chunks), per)]
        else:
            chunks = []
            while len(carry) > STEP_COLLS:
                chunk, carry = carry[:STEP_COLLS], carry[STEP_COLLS:]
                chunks.append(chunk)
        for chunk in chunks:
            out += self._step(chunk, dumps, by_key, groups, flying, failed, now_ns)
            self.drawn.update(chunk)
            drawn_at.update((k, first[k]) for k in chunk)
            self.step += 1
            self.steps += 1
        if hung and (carry or pending):
            self.open = carry or [None]  # (None: the hang's step is open, nothing settled in it yet)
            out += self._step(carry + pending, dumps, by_key, groups, flying, failed, now_ns)
        return out

    def _settled(self, key: tuple, dumps, by_key, groups, flying: set) -> bool:
        """Ended on every rank holding it, issued by every rank of its group that answered."""
        name, p2p, seq = key
        for r in dumps:
            es = by_key[r].get(key)
            if es is not None:
                if any(id(e) in flying for e in es):
                    return False
            elif not p2p:
                g = groups.get(name)
                at = g.at.get(r) if g is not None else None
                if g is not None and r in g.ranks and (at is None or at.last_issued is None or at.last_issued < seq):
                    if at is not None and at.known_from > seq:
                        continue  # (its buffer no longer reaches back to it)
                    return False  # not issued there yet
        return True

    def _step(self, keys: list[tuple], dumps, by_key, groups, flying: set, failed: set, now_ns: int) -> list:
        """One step's frames: each rank's new table rows, then its spans."""
        origin = self.origin
        per: dict[int, list] = {}
        for r, d in dumps.items():
            if r >= self.world:
                continue
            got = []
            for key in keys:
                g = groups.get(key[0])
                gi = self.group_index.get(key[0], -1)
                size = max(1, min(len(g.ranks), self.world)) if g is not None and g.ranks else self.world
                label = self.layers[gi] if gi >= 0 else key[0][:64]
                for e in by_key[r].get(key, ()):
                    row = coll_row(e, size, label, gi)
                    if row is None:
                        continue
                    got.append((row, *(max(0, t - origin) for t in span_of(e, flying, failed, now_ns, now_ns))))
            per[r] = got
        return step_frames(self.step, self.world, self.tables, per)


def run_meta(world: int, backend: str, target: str, layers: list[str]) -> dict:
    """The run's description (a recording's header) of an attached job."""
    gpu = backend not in frverdict.NO_STATE_BACKENDS and backend != ""
    return {"ddptui": "0.1.0", "model": MODEL, "strategies": [STRATEGY], "world": world,
            "layers": list(layers), "params": [], "steps": 0, "batch": 0, "backend": backend, "user": True,
            "source": "attach", "attached_to": target, "device": "cuda" if gpu else "cpu",
            "devices": {str(r): ("cuda" if gpu else "cpu") for r in range(world)}}

