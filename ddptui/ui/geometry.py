"""The timeline panes' geometry without Textual (the view model plans the screen with it,
the TimelinePane widget draws in it): lane shapes, rows a pane needs for its ranks, which
ranks fit, round axis lengths."""
from __future__ import annotations

import math

# (rows per lane, rows between ranks), best first (no gap needed after the last rank)
LANE_SHAPES = ((4, 1), (3, 1), (2, 1), (1, 1), (1, 0))
COMFORT = LANE_SHAPES[1]  # lanes grow to this before the panels below get more room


def nice_ceil(x: float, steps=(1, 2, 5, 10)) -> float:
    """The smallest of steps x 10^k that is >= x (ticks: 1, 2, 5)."""
    if x <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(x))
    return next(m * e for m in steps if m * e >= x * (1 - 1e-9))


def span_ceil(x: float) -> float:
    """A round axis length >= x, finer than the tick steps so that little width is wasted."""
    return nice_ceil(x, (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10))


def rows_min(ranks: int) -> int:
    """Header, axis and one rank's lanes (and, with more ranks, the note of those hidden)."""
    return 5 if ranks > 1 else 4


def rows_for(ranks: int, shape: tuple[int, int]) -> int:
    """Header, axis and every rank's lanes in this (rows per lane, gap) shape."""
    lane_h, gap = shape
    return 2 + (2 * lane_h + gap) * ranks - gap


def rows_max(ranks: int) -> int:
    """Every rank with comfortable lanes; more is welcome (LANE_SHAPES[0]) but not owed."""
    return rows_for(ranks, COMFORT)


def rows_big(ranks: int) -> int:
    return rows_for(ranks, LANE_SHAPES[0])


def fit_ranks(ranks: list[int], rows: int) -> tuple[list[int], list[int], int, int]:
    n = len(ranks)
    for lane_h, gap in LANE_SHAPES:
        if n * (2 * lane_h + gap) - gap <= rows:
            return ranks, [], lane_h, gap
    fit = max(0, (rows - 1) // 2)
    return ranks[:fit], ranks[fit:], 1, 0
