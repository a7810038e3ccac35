"""Per-host clock offset and drift from NTP-style exchanges (pure; no sockets here).

Node 0 sends a ping stamped t1 (its clock); the other host stamps t2 when it receives it and
t3 when it answers (its own clock); node 0 stamps t4 on receipt. Then

    offset = ((t2 - t1) + (t3 - t4)) / 2     (their clock minus ours)
    delay  = (t4 - t1) - (t3 - t2)           (round trip on the wire)

and the true offset lies within offset ± delay / 2 whatever the asymmetry of the path. Only
the lowest-delay samples are kept (queueing only ever adds delay): the best of each burst,
the burst taken at connect and every few seconds. The offset at time t (our clock) is a line
through those (drift = its slope) once they span long enough, else the best sample's offset.

`to_ours(ns)` maps a time of that host onto ours; `uncertainty_ns` is half the best delay
plus how far the kept samples stray from the line.

An asymmetric path (one way slower than the other) puts the NTP offset anywhere in that
± half-delay, so it is then refined from the run's own collectives (`refine`): an AllReduce
ends at nearly the same moment on every rank, so each collective's end there minus its end
here reads the offset (noisy: a rank returns from a collective when its thread runs, but
with no preferred sign; the median over many steps is taken). And no rank's AllReduce can end
before every rank was ready for it, which bounds the offset hard on both sides (`CollSample`
lo/hi). The refined offset is the NTP line shifted by the inverse-variance mean of the two
readings, kept inside both hard bounds; its uncertainty is twice the combined standard
error, never more than the distance to the hard bounds — and, when a hard bound stopped the
mean (the readings are then biased), that distance itself.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median

from ranks import frames

MIN_DRIFT_SPAN_NS = 5_000_000_000  # fit drift only over samples this far apart
MAX_DRIFT = 500e-6  # |drift| above 500 ppm is not a clock: ignore it
MIN_STEPS = 8  # refine from collectives only once they come from at least this many steps
KEEP_COLLECTIVES = 4096  # per host, the latest collectives kept for the refinement
STAMP_NS = 1_000  # spans carry µs: each time is up to this much early


@dataclass
class Sample:
    at: int  # our clock, midpoint of the exchange
    offset: int
    delay: int


def sample(t1: int, t2: int, t3: int, t4: int) -> Sample:
    return Sample(at=(t1 + t4) // 2, offset=((t2 - t1) + (t3 - t4)) // 2, delay=max(0, (t4 - t1) - (t3 - t2)))


class ClockEstimate:
    def __init__(self, keep: int = 64):
        self.keep = keep
        self.best: list[Sample] = []  # the best sample of each burst, oldest first
        self._burst: Sample | None = None
        self.samples = 0
        self.offset_ns = 0
        self.drift = 0.0  # ns of offset per ns of our clock
        self.ref_ns = 0  # the fit's reference time (our clock)
        self.uncertainty_ns: int | None = None

    def add(self, t1: int, t2: int, t3: int, t4: int) -> None:
        s = sample(t1, t2, t3, t4)
        if t4 < t1 or t3 < t2:
            return  # not a real exchange
        self.samples += 1
        if self._burst is None or s.delay < self._burst.delay:
            self._burst = s

    def end_burst(self) -> bool:
        """Keep the burst's best sample and refit; True when there was one."""
        if self._burst is None:
            return False
        self.best.append(self._burst)
        self._burst = None
        del self.best[:-self.keep]
        self._fit()
        return True

    @property
    def known(self) -> bool:
        return self.uncertainty_ns is not None

    def _fit(self) -> None:
        pts = self.best
        top = min(pts, key=lambda s: s.delay)
        # the lower half of the bursts by delay (at least two) carry the line
        good = sorted(pts, key=lambda s: s.delay)[:max(2, (len(pts) + 1) // 2)]
        good.sort(key=lambda s: s.at)
        drift = 0.0
        if len(good) >= 2 and good[-1].at - good[0].at >= MIN_DRIFT_SPAN_NS:
            n = len(good)
            mx = sum(s.at for s in good) / n
            my = sum(s.offset for s in good) / n
            sxx = sum((s.at - mx) ** 2 for s in good)
            sxy = sum((s.at - mx) * (s.offset - my) for s in good)
            drift = sxy / sxx if sxx else 0.0
            if abs(drift) > MAX_DRIFT:
                drift = 0.0
        if drift:
            self.ref_ns = int(mx)
            self.offset_ns = int(round(my))
            spread = max(abs(s.offset - self.offset_ns - drift * (s.at - self.ref_ns)) for s in good)
        else:
            self.ref_ns = top.at
            self.offset_ns = top.offset
            spread = 0
        self.drift = drift
        self.uncertainty_ns = int(top.delay // 2 + spread)

    def offset_at(self, ours_ns: int) -> int:
        return self.offset_ns + int(self.drift * (ours_ns - self.ref_ns))

    def to_ours(self, theirs_ns: int) -> int:
        """A time of that host on our axis (the offset at ~that time; drift is tiny)."""
        return theirs_ns - self.offset_at(theirs_ns - self.offset_ns)

    def as_dict(self) -> dict:
        return {"offset_ns": self.offset_ns, "uncertainty_ns": self.uncertainty_ns,
                "drift_ppm": round(self.drift * 1e6, 3), "ref_ns": self.ref_ns, "samples": self.samples}


@dataclass
class CollSample:
    """One collective between node 0 and another host, in raw times (ns)."""
    at: int  # its end on node 0 (our clock)
    d: int  # its end there (their clock) minus its end here: an offset reading
    lo: int  # the offset is at least this: a rank there was ready before our end
    hi: int  # ... and at most this: their end came after our ready
    step: tuple = ()  # (strategy, step): the collectives of one step err together


def coll_sample(ready0: list[int], end0: list[int], ready_h: list[int], end_h: list[int],
                step: tuple = ()) -> CollSample:
    """From one collective's ready and end times on node 0's ranks (our clock) and on one
    host's ranks (its clock). With theta = their clock minus ours: a rank b there was ready
    before any rank a here ended, ready_b - theta <= end_a, so theta >= ready_b - end_a;
    likewise theta <= end_b - ready_a. Each bound is widened by the µs the times were cut to."""
    e0 = median(end0)
    return CollSample(at=int(e0), d=int(median(end_h) - e0), lo=max(ready_h) - min(end0) - STAMP_NS,
                      hi=min(end_h) - max(ready0) + STAMP_NS, step=step)


@dataclass
class Refined:
    offset_ns: int  # NTP offset + residual
    uncertainty_ns: int
    residual_ns: int  # what the collectives moved the NTP offset by
    n: int  # collectives used
    steps: int  # the steps they came from


def refine(est: ClockEstimate, samples) -> Refined | None:
    """The NTP estimate refined from collectives (module docstring); None while they come
    from too few steps, or when they contradict the NTP bound (then the NTP estimate stands).

    The collectives of one step share its scheduling, so they are not independent readings:
    each step gives one (the median of its collectives' residuals), and the standard error
    comes from the spread of those over the steps."""
    if not est.known or not samples:
        return None
    by_step: dict[tuple, list[int]] = {}
    lo, hi = -math.inf, math.inf
    for s in samples:  # residuals against the NTP line at each collective's time (it carries the drift)
        line = est.offset_at(s.at)
        by_step.setdefault(s.step, []).append(s.d - line)
        lo, hi = max(lo, s.lo - line), min(hi, s.hi - line)
    if len(by_step) < MIN_STEPS:
        return None
    u = max(est.uncertainty_ns, 1)
    lo, hi = max(-u, lo), min(u, hi)
    if lo > hi:
        return None
    res = [median(v) for v in by_step.values()]
    m = median(res)
    mad = median(abs(r - m) for r in res)
    # the standard error of a median: 1.2533 sigma / sqrt(n), sigma from the MAD (1.4826)
    se_c = max(1.2533 * 1.4826 * mad / math.sqrt(len(res)), STAMP_NS)
    se_n = u / math.sqrt(3)  # NTP: anywhere within +-u
    w_c, w_n = 1 / se_c ** 2, 1 / se_n ** 2
    mean = m * w_c / (w_c + w_n)
    r = min(max(mean, lo), hi)
    if r != mean:  # a hard bound stopped it: the readings are biased, only the bounds hold
        unc = max(r - lo, hi - r)
    else:
        unc = min(2 / math.sqrt(w_c + w_n), max(r - lo, hi - r))
    return Refined(est.offset_ns + int(round(r)), max(int(math.ceil(unc)), 1), int(round(r)),
                   len(samples), len(res))


def clock_frame(node: int, host: str, est: ClockEstimate, ref: Refined | None) -> frames.Clock:
    """The `clock` frame for a host: the NTP line, shifted by the refinement when there is one."""
    if ref is None:
        return frames.Clock(node=node, host=host, offset_ns=est.offset_ns, uncertainty_ns=est.uncertainty_ns,
                            drift=est.drift, ref=est.ref_ns, samples=est.samples)
    return frames.Clock(node=node, host=host, offset_ns=ref.offset_ns, uncertainty_ns=ref.uncertainty_ns,
                        drift=est.drift, ref=est.ref_ns, samples=est.samples, ntp_offset_ns=est.offset_ns,
                        ntp_uncertainty_ns=est.uncertainty_ns, collectives=ref.n, steps=ref.steps)


def map_ns(clock: frames.Clock | None, ns: int) -> int:
    """A time of a host whose ``clock`` frame (offset, drift, ref) is given, on node 0's axis."""
    if clock is None:
        return ns
    off = clock.offset_ns
    return ns - off - int((clock.drift or 0.0) * (ns - off - (clock.ref or 0)))


class HostClocks:
    """The node and clock frames of a run (live or recorded): rank -> host -> node 0's axis."""

    def __init__(self):
        self.node_of: dict[int, int] = {}
        self.clocks: dict[int, frames.Clock] = {}

    def observe(self, f: frames.Node | frames.Clock) -> None:
        cls = type(f)
        if cls is frames.Node:
            self.node_of[f.rank] = f.node
        elif cls is frames.Clock:
            self.clocks[f.node] = f

    def to_common(self, rank: int, ns: int) -> int:
        return map_ns(self.clocks.get(self.node_of.get(rank, 0)), ns) if self.clocks else ns

    def offsets(self, host0) -> list[dict]:
        return offsets(self.node_of, self.clocks, host0)


def offsets(node_of: dict, clocks: dict[int, frames.Clock], host0) -> list[dict]:
    """The JSON `clock_offsets` list: node 0 itself, then every host with an estimate ([] on one host)."""
    if not node_of and not clocks:
        return []
    out = [{"host": str(host0 or "node0"), "node_rank": 0, "offset_ns": 0, "uncertainty_ns": 0,
            "collectives": 0, "steps": 0}]
    for n, c in sorted(clocks.items()):
        if n:
            o = {"host": c.host, "node_rank": n, "offset_ns": c.offset_ns, "uncertainty_ns": c.uncertainty_ns,
                 "collectives": c.collectives or 0, "steps": c.steps or 0}
            if c.ntp_offset_ns is not frames.UNSET:  # refined from collectives: what the exchanges alone said
                o["ntp_offset_ns"] = c.ntp_offset_ns
                if c.ntp_uncertainty_ns is not frames.UNSET:
                    o["ntp_uncertainty_ns"] = c.ntp_uncertainty_ns
            out.append(o)
    return out
