"""The UI's state and arithmetic, without Textual: which step each pane shows, the shared
time scale, and the screen plan. Pure enough to test without a running app.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from ranks import spec

from ddptui.model.store import Store
from . import geometry
from .geometry import LANE_SHAPES, span_ceil

ZOOMS = (1, 2, 4, 8, 16, 32)
LOOKBACK = 500  # steps searched back for a complete one
FOLLOW_EVERY_S = 0.3  # live: the newest step is taken up at most this often (a step stays readable)
SPAN_HEADROOM = 1.05  # the axis is a round length at least this much longer than the longest step
SHRINK_BELOW = 0.7  # the axis shrinks once the longest recent step stays below this share of it…
SHRINK_STEPS = 8  # …for this many newly shown steps…
SHRINK_AFTER_S = 3.0  # …and this many seconds
SHRINK_HEADROOM = 1.15  # a shrunk axis leaves more room: jitter should not make it grow back


class SpanScale:
    """The shared axis length (ms), kept steady while steps jitter: it grows at once when a
    step does not fit, and shrinks only after every step shown for SHRINK_STEPS new steps and
    SHRINK_AFTER_S seconds stayed below SHRINK_BELOW of it. Lengths are round (span_ceil)."""

    def __init__(self):
        self.span_ms: float | None = None
        self._key: tuple | None = None
        self._recent: deque = deque()  # (time, longest step) per newly shown set of steps
        # the length was set by warm-up steps (each strategy's first: a replay's loop starts
        # with them, 5-60x a steady step on the first H100): the first steady step sets it anew
        self._warm = False

    def update(self, want: float, key: tuple, now: float, warm: bool = False) -> float:
        """`want`: the longest step shown (ms); `key`: which steps; `warm`: every one shown is
        its strategy's first step (a warm-up)."""
        if self._warm and not warm and key != self._key:
            self._warm = False
            self.span_ms = span_ceil(want * SPAN_HEADROOM)
            self._recent.clear()
            self._key = key
            return self.span_ms
        if self.span_ms is None or want > self.span_ms:
            self.span_ms = span_ceil(want * SPAN_HEADROOM)
            self._recent.clear()
            self._key = key
            self._warm = warm
            return self.span_ms
        if key != self._key:  # paused or unchanged: no new evidence, the scale stays
            self._key = key
            recent = self._recent
            recent.append((now, want))
            while len(recent) > SHRINK_STEPS and recent[1][0] <= now - SHRINK_AFTER_S:
                recent.popleft()
            longest = max(w for _, w in recent)
            if (len(recent) >= SHRINK_STEPS and now - recent[0][0] >= SHRINK_AFTER_S
                    and longest < SHRINK_BELOW * self.span_ms):
                self.span_ms = min(self.span_ms, span_ceil(longest * SHRINK_HEADROOM))
                recent.clear()
        return self.span_ms


def latest_steps(store: Store) -> list[int]:
    """The newest complete step of each strategy that has one."""
    return [k for k in (store.latest_complete(s) for s in store.strategies()) if k is not None]


class ViewModel:
    """Which step each pane shows (following the newest, paused on a pinned step, or where a
    replay stands), the zoom, and the steady time scale. `clock` drives the scale's patience
    (tests set it); `follow_clock` paces following."""

    def __init__(self, clock=time.monotonic, follow_clock=time.monotonic):
        self.paused = False
        self.pinned: int | None = None
        self.zoom_i = 0
        self.scale = SpanScale()
        self.clock = clock
        self.follow_clock = follow_clock
        self._follow: dict[str, int | None] | None = None
        self._follow_t = 0.0

    @property
    def zoom(self) -> int:
        return ZOOMS[self.zoom_i]

    def changed(self) -> None:
        """The user did something: take up the newest steps at the next frame."""
        self._follow = None

    def shown_steps(self, store: Store, replay_at: int | None = None, replay: bool = False) -> dict[str, int | None]:
        """The step each strategy pane shows. A replay shows the steps at or before where it
        stands (`replay_at`, -1 or None: nothing yet); live follows unless paused."""
        if replay:
            if replay_at is None or replay_at < 0:
                return {s: None for s in store.strategies()}
            target = replay_at
        elif self.paused:
            target = self.pinned
        else:
            return self._following(store)
        return {s: store.last_complete(s, target, LOOKBACK) for s in store.strategies()}

    def _following(self, store: Store) -> dict[str, int | None]:
        """The newest complete steps, taken at most every FOLLOW_EVERY_S: a step stays on
        screen long enough to be read, and fast runs cost fewer new views."""
        now = self.follow_clock()
        stale = self._follow is None or set(self._follow) != set(store.strategies())
        if stale or now - self._follow_t >= FOLLOW_EVERY_S:
            self._follow = {s: store.last_complete(s, None, LOOKBACK) for s in store.strategies()}
            self._follow_t = now
        return dict(self._follow)

    def toggle_pause(self, store: Store) -> None:
        self.paused = not self.paused
        if self.paused:
            shown = [k for k in self.shown_steps(store).values() if k is not None]
            self.pinned = min(shown) if shown else None
        self.changed()

    def step(self, store: Store, delta: int) -> bool:
        """Live: move the pinned step (pausing first); False when there is no step yet."""
        latest = latest_steps(store)
        if not latest:
            return False
        if not self.paused:
            self.paused, self.pinned = True, min(latest)
        self.pinned = min(max(store.oldest_step(), (self.pinned or 0) + delta), min(latest))
        self.changed()
        return True

    def zoom_by(self, d: int) -> None:
        self.zoom_i = min(len(ZOOMS) - 1, max(0, self.zoom_i + d))
        self.changed()

    def ms_per_cell(self, views: dict, lane_w: int, store_id: int = 0) -> float:
        """One scale for every pane: the steady axis length over the narrowest lane."""
        durs = [v.duration_ms for v in views.values() if v is not None]
        if durs:
            key = (store_id, *((s, v.step) for s, v in sorted(views.items()) if v is not None))
            warm = all(v.step == 0 for v in views.values() if v is not None)
            self.scale.update(max(durs), key, self.clock(), warm)
        return (self.scale.span_ms or 100.0) / self.zoom / max(1, lane_w)


# -- controls ------------------------------------------------------------------------------
def next_bucket_cap(store: Store, asked: float | None, direction: int) -> float | None:
    """The next cap up (direction > 0) or down the bucket ladder from the one asked last, else
    the one in force (the run's default before any change); None at either end."""
    current = asked
    if current is None:
        changes = store.cap_history()
        current = changes[-1][1] if changes else float(store.meta.bucket_cap_mb or spec.DEFAULT_BUCKET_CAP_MB)
    ladder = spec.BUCKET_LADDER_MB
    return (max((x for x in ladder if x < current), default=None) if direction < 0
            else min((x for x in ladder if x > current), default=None))


def straggler_ask(store: Store, on_ms: float) -> float:
    """What `d` asks for: 0 (off) while a straggler is on, else half the median of the recent
    steps over every strategy (at least 2 ms; 40 ms before any step), so it shows at any speed."""
    if on_ms:
        return 0.0
    steps = sorted(f.step_ms for s in store.strategies() for f in store.recent_figures(s, n=10))
    return float(max(2, round(0.5 * steps[len(steps) // 2]))) if steps else 40.0


def straggler_where(store: Store) -> str:
    """Where `d` puts it: the highest rank, its middle layer."""
    names = list(store.meta.layers)
    return f"rank {max(store.world - 1, 0)} · {names[(len(names) - 1) // 2]}" if names else "the highest rank"


# -- screen plan -----------------------------------------------------------------------------
PANE_MIN_WIDTH = 80  # panes go side by side when each can have this many columns
FIXED_ROWS = 5  # title, headline, legend, status and footer


def panel_columns(width: int) -> int:
    """Panels side by side below the lanes: 1 below 170 columns, 2 below 270, then 3."""
    return 1 if width < 170 else 2 if width < 270 else 3


def pane_rows(ranks: list[int], avail: int) -> list[int]:
    """Heights of the grid rows of panes: each gets its minimum (room for one rank), the
    rest is shared by the ranks still to show, up to the thickest lanes (rows with as many
    ranks get the same height); when even the minimum does not fit, the rows share the
    height evenly."""
    base = [geometry.rows_min(r) for r in ranks]
    if avail < sum(base):  # too small for one rank each: share what there is (each says so)
        even = max(2, avail // len(ranks))
        return [even + (1 if i < avail - even * len(ranks) else 0) for i in range(len(ranks))]
    want = [geometry.rows_big(r) - b for r, b in zip(ranks, base)]
    spare = avail - sum(base)
    total = sum(want) or 1
    return [b + min(wt, spare * wt // total) for b, wt in zip(base, want)]


def lane_shape_rows(rows: list[int], avail: int) -> list[int]:
    """Pane heights that fit the thickest lane shape all panes can have within `avail`
    (no half-used rows); pane_rows when not even the thinnest shape fits."""
    for shape in LANE_SHAPES:
        need = [geometry.rows_for(r, shape) for r in rows]
        if sum(need) <= avail:
            return need
    return pane_rows(rows, avail)


@dataclass(frozen=True)
class PanelSpec:
    """What a panel asks for (its widget class says: rows_min, rows_max, MIN_WIDTH, GROW)."""
    name: str
    rows_min: int  # 0: nothing to show now
    rows_max: int
    min_width: int = 40
    grow: bool = False  # takes the rows nobody else wants


@dataclass(frozen=True)
class ScreenPlan:
    cols: int  # panes per grid row
    pane_rows: tuple[int, ...]  # height of each grid row of panes
    panel_cols: int  # panels per shelf
    shelves: tuple[tuple[str, ...], ...]  # panels shown, shelf by shelf (rows of the panel grid)
    shelf_rows: tuple[int, ...]

    @property
    def shown(self) -> set[str]:
        return {n for shelf in self.shelves for n in shelf}


def plan_screen(width: int, height: int, ranks: list[int], panels: list[PanelSpec],
                banner_rows: int = 0) -> ScreenPlan:
    """Where everything goes. `ranks`: the ranks of each strategy pane, in order; `panels`:
    in order of priority. The lanes get their minimum first, then the panels up to a third
    of the height (even when the lanes then get less than their minimum), then the lanes
    comfortable rows, then the panels what they want, then the
    lanes their thickest shape, and the growing panels the rest."""
    ranks = ranks or [1]
    n = len(ranks)
    cols = max(1, min(n, width // PANE_MIN_WIDTH))
    rows = [max(ranks[i:i + cols]) for i in range(0, n, cols)]
    avail = max(0, height - FIXED_ROWS - banner_rows)
    k = panel_columns(width)
    fit = [p for p in panels if p.rows_min > 0 and p.min_width <= width // k]
    chunks = [fit[i:i + k] for i in range(0, len(fit), k)]
    lo = [max(p.rows_min for p in c) for c in chunks]
    hi = [max(max(p.rows_max for p in c), lo[i]) for i, c in enumerate(chunks)]
    grow = [any(p.grow for p in c) for c in chunks]
    size = [0] * len(chunks)  # 0: not shown
    budget = avail // 3
    for i in range(len(chunks)):  # panels first, within a third of the height
        if lo[i] <= budget:
            size[i] = min(hi[i], budget)
            budget -= size[i]
    lanes = sum(geometry.rows_min(r) for r in rows)
    left = avail - lanes - sum(size)
    if left > 0:
        more = min(left, sum(geometry.rows_max(r) for r in rows) - lanes)  # comfortable lanes
        lanes, left = lanes + max(0, more), left - max(0, more)
        for i in range(len(chunks)):  # panels: more shelves, then what each wants
            if not size[i] and lo[i] <= left:
                size[i], left = lo[i], left - lo[i]
        for i in range(len(chunks)):
            if size[i]:
                add = min(left, hi[i] - size[i])
                size[i], left = size[i] + add, left - add
        more = min(left, sum(geometry.rows_big(r) for r in rows) - lanes)  # thickest lanes
        lanes, left = lanes + max(0, more), left - max(0, more)
    else:
        lanes, left = avail - sum(size), 0
    heights = lane_shape_rows(rows, lanes)
    left += lanes - sum(heights)  # what the lanes' shape cannot use
    for i in range(len(chunks)):  # the rest to a growing panel
        if size[i] and grow[i] and left > 0:
            size[i], left = size[i] + left, 0
    if left > 0 and heights:  # nobody grows: the panes keep it
        heights[-1] += left
    shown = [i for i in range(len(chunks)) if size[i]]
    return ScreenPlan(cols, tuple(heights), k,
                      tuple(tuple(p.name for p in chunks[i]) for i in shown), tuple(size[i] for i in shown))


__all__ = ["ViewModel", "SpanScale", "ScreenPlan", "PanelSpec", "plan_screen", "pane_rows", "latest_steps", "ZOOMS"]
