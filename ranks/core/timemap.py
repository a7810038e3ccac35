"""GPU timer -> host CLOCK_MONOTONIC: a linear fit (offset and drift) of bracketed calibrations
(`GpuTimeMap`), and a calibration point's place on the chained GPU axis (`CalPoint`).
`ranks.core.clocks.CudaClock` takes the calibrations, between steps, never inside one."""
from __future__ import annotations

from collections import deque


class GpuTimeMap:
    """GPU timer -> host CLOCK_MONOTONIC, from bracketed calibrations.

    A calibration point is an event recorded on an idle stream between two host readings
    h0 < h1: the GPU stamped it inside [h0, h1], estimated at the midpoint with an error of at
    most (h1 - h0) / 2. Points are chained on the GPU side by the elapsed time between
    consecutive calibration events (each a short interval: exact enough in float32), so `g`
    (GPU ns since the first point) never suffers float32 rounding however long the run.
    host(g) = a + rate * g is a least-squares fit over the recent low-delay points: the
    offset and the drift (ppm) between the two oscillators, re-estimated at each point.
    """

    WINDOW = 32

    def __init__(self):
        self.points: deque = deque(maxlen=self.WINDOW)  # (g_ns, h_ns, delay_ns)
        # (h_base, a, rate) as one tuple, replaced whole: calibrate() runs on the training
        # thread while the sender resolves steps with it (a reader of separate attributes
        # could take a new offset with an old rate: off by the change in drift times the GPU
        # time since the first point, ~100 µs after hours)
        self.fit = (None, 0.0, 1.0)
        self.residual_ns: int | None = None  # prediction - measurement at the last point
        # how far a mapped time may be off: half the widest bracket among the points in use
        self.bound_ns: int | None = None

    @property
    def a(self) -> float:
        return self.fit[1]

    @property
    def rate(self) -> float:
        return self.fit[2]

    @property
    def h_base(self):
        return self.fit[0]

    def add(self, g_ns: float, h0: int, h1: int) -> None:
        base, a, rate = self.fit
        if base is None:
            base = h0
        h = (h0 + h1) / 2 - base
        if self.points:
            self.residual_ns = int(round(a + rate * g_ns - h))
        self.points.append((g_ns, h, h1 - h0))
        self.fit = (base, *self._fit(rate))

    def _fit(self, rate: float) -> tuple[float, float]:
        """(a, rate) over the recent low-delay points (`rate`: the one in force); sets
        `bound_ns`, half the widest bracket among them."""
        pts = self.points
        best = min(p[2] for p in pts)
        use = [p for p in pts if p[2] <= 2 * best + 2_000] or list(pts)
        if len(use) < 2 or use[-1][0] - use[0][0] < 1e8:  # under 0.1 s: offset only
            g, h, w = min(pts, key=lambda p: p[2]) if len(use) < 2 else use[-1]
            self.bound_ns = int(w) // 2
            return h - rate * g, rate
        self.bound_ns = int(max(p[2] for p in use)) // 2
        n = len(use)
        mg = sum(p[0] for p in use) / n
        mh = sum(p[1] for p in use) / n
        sxx = sum((p[0] - mg) ** 2 for p in use)
        sxy = sum((p[0] - mg) * (p[1] - mh) for p in use)
        rate = sxy / sxx if sxx > 0 else 1.0
        return mh - rate * mg, rate

    def host_ns(self, g_ns: float) -> int:
        base, a, rate = self.fit
        return int(round(base + a + rate * g_ns))


class CalPoint:
    """A calibration event and its place on the chained GPU axis."""

    __slots__ = ("event", "g_ns")

    def __init__(self, event, g_ns: float):
        self.event, self.g_ns = event, g_ns
