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
"""
from __future__ import annotations

from dataclasses import dataclass

MIN_DRIFT_SPAN_NS = 5_000_000_000  # fit drift only over samples this far apart
MAX_DRIFT = 500e-6  # |drift| above 500 ppm is not a clock: ignore it


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


def map_ns(clock: dict | None, ns: int) -> int:
    """A time of a host whose ``clock`` frame (off, drift, ref) is given, on node 0's axis."""
    if clock is None:
        return ns
    off = clock["off"]
    return ns - off - int(clock.get("drift", 0.0) * (ns - off - clock.get("ref", 0)))


class HostClocks:
    """The node and clock frames of a run (live or recorded): rank -> host -> node 0's axis."""

    def __init__(self):
        self.node_of: dict[int, int] = {}
        self.clocks: dict[int, dict] = {}

    def observe(self, f: dict) -> None:
        if f["t"] == "node":
            self.node_of[f["r"]] = f["node"]
        elif f["t"] == "clock":
            self.clocks[f["node"]] = f

    def to_common(self, rank: int, ns: int) -> int:
        return map_ns(self.clocks.get(self.node_of.get(rank, 0)), ns) if self.clocks else ns

    def offsets(self, host0) -> list[dict]:
        return offsets(self.node_of, self.clocks, host0)


def offsets(node_of: dict, clocks: dict, host0) -> list[dict]:
    """The JSON `clock_offsets` list: node 0 itself, then every host with an estimate ([] on one host)."""
    if not node_of and not clocks:
        return []
    out = [{"host": str(host0 or "node0"), "node_rank": 0, "offset_ns": 0, "uncertainty_ns": 0}]
    for n, c in sorted(clocks.items()):
        if n:
            out.append({"host": c["host"], "node_rank": n, "offset_ns": c["off"], "uncertainty_ns": c["unc"]})
    return out
