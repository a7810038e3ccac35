"""The timeline panes' geometry without Textual (the view model plans the screen with it,
the TimelinePane widget draws in it): lane shapes, rows a pane needs for its ranks, which
ranks fit, round axis lengths."""
from __future__ import annotations

import math
from dataclasses import dataclass

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


# -- many layers in a lane: consecutive blocks drawn as one bar -----------------------------
MIN_CELLS_PER_BAR = 5  # a layer's bar gets at least this many cells, on average (room for '0-3')
GROUP_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
KEEP = 0.3  # a size in use stays while its bars are within 30 % of MIN_CELLS_PER_BAR, either way


def block_runs(names: list[str]) -> list[tuple[int, int, str, int]]:
    """Runs of repeated blocks among layers (in forward order): consecutive names
    `prefix.N`, `prefix.N+1`, ... (two or more) as (first index, end index, prefix, N of
    the first)."""
    out = []
    i, n = 0, len(names)
    while i < n:
        head, _, num = names[i].rpartition(".")
        if not (head and num.isdigit()):
            i += 1
            continue
        j, k = i + 1, int(num)
        while j < n and names[j] == f"{head}.{k + j - i}":
            j += 1
        if j - i >= 2:
            out.append((i, j, head, k))
        i = j
    return out


def _units(names: list[str], runs, size: int) -> int:
    """Bars a pass over the layers makes with blocks `size` a bar."""
    blocks = sum(e - a for a, e, _, _ in runs)
    return len(names) - blocks + sum(-(-(e - a) // size) for a, e, _, _ in runs)


def group_size(names: list[str], cells: float, spans: int, last: int = 1) -> int:
    """How many consecutive blocks of a run one bar draws (GROUP_SIZES): the smallest size
    at which a lane's layer bars get MIN_CELLS_PER_BAR cells on average, given the cells its
    layer spans cover (at the scale and zoom shown) and their number; 1 without runs of
    blocks. The size in use (`last`) is kept while its bars stay within KEEP of the mark
    (steps that jitter do not regroup the lane at every step)."""
    runs = block_runs(names)
    if not runs or spans <= 0 or cells <= 0:
        return 1
    passes = spans / len(names)  # (forward and backward, of each micro-step)

    def per_bar(size):
        return cells / (passes * _units(names, runs, size))
    want = next((g for g in GROUP_SIZES if per_bar(g) >= MIN_CELLS_PER_BAR), GROUP_SIZES[-1])
    if last in GROUP_SIZES and want != last:
        if want < last and per_bar(want) < MIN_CELLS_PER_BAR * (1 + KEEP):
            return last  # (room for smaller groups, but only just)
        if want > last and per_bar(last) >= MIN_CELLS_PER_BAR * (1 - KEEP):
            return last  # (a little short of room: the groups stay)
    return want


@dataclass(frozen=True)
class LayerGroups:
    """How a lane draws its layers: `of[layer]` its group, `labels[group]`; `size` blocks a
    group (1: each layer its own bar), `blocks` the layers in runs of blocks."""
    size: int
    of: tuple[int, ...]
    labels: tuple[str, ...]
    blocks: int

    @property
    def groups(self) -> int:
        return len(self.labels)


def layer_groups(names: list[str], size: int) -> LayerGroups | None:
    """Each run of blocks (block_runs) cut into groups of `size` consecutive blocks, from its
    first (the last group may be shorter), labelled `h.0-3` (the run's last name part and the
    blocks' numbers); every other layer a group of its own, under its name. None for size 1
    or without runs."""
    runs = block_runs(names)
    if size <= 1 or not runs:
        return None
    of, labels = [], []
    starts = {a: (e, head, k) for a, e, head, k in runs}
    i = 0
    while i < len(names):
        if i not in starts:
            of.append(len(labels))
            labels.append(names[i])
            i += 1
            continue
        e, head, k = starts[i]
        short = head.rpartition(".")[2]
        for a in range(i, e, size):
            z = min(a + size, e)
            lo, hi = k + a - i, k + z - 1 - i
            of += [len(labels)] * (z - a)
            labels.append(f"{short}.{lo}-{hi}" if hi > lo else f"{short}.{lo}")
        i = e
    return LayerGroups(size, tuple(of), tuple(labels), sum(e - a for a, e, _, _ in runs))
