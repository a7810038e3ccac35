"""One strategy's pane: a header, a time axis, and per rank a compute and a comm lane.

A Line-API widget: every lane line is a cached Strip keyed by everything that shapes it
within the step shown (width, scale, rank, lane, row), and a new step empties the cache, so
a redraw of an unchanged step is lookups.
"""
from __future__ import annotations

from dataclasses import dataclass

from rich.segment import Segment
from textual.strip import Strip
from textual.widget import Widget

from ranks.wire import BWD, FWD

from ddptui.model.collectives import WORLD, group_label
from ddptui.model.views import Lane, StepView, sampling_text
from . import theme
from ddptui.ui import geometry
from ddptui.ui.geometry import fit_ranks, nice_ceil
from .lanes import coll_look, comm_bars, compute_bars, lane_segments

GUTTER = 9  # "r12 comp "
CACHE_MAX = 2048  # lane strips kept per pane
_BRIGHT, _DIM, _BLANK = theme.style(theme.TEXT, bold=True), theme.style(theme.DIM), theme.style()


def short_param(name: str) -> str:
    """'fc3.0.weight' -> 'fc3.w'."""
    parts = name.split(".")
    return f"{parts[0]}.{parts[-1][:1]}" if len(parts) > 1 else name


@dataclass
class PaneState:
    """What a pane shows; the app builds one per strategy per frame."""
    view: StepView | None
    ms_per_cell: float
    cap_note: str = ""  # DDP: a bucket cap asked for but not applied yet
    cap_since: int | None = None  # DDP: step where the current cap took effect
    nodes: tuple | None = None  # multi-node: ((rank, node), ...) — lanes grouped and labelled by host
    labels: dict | None = None  # aggregated lanes (widgets/aggregate.py): lane -> (compute, comm) labels
    plan_pct: float | None = None  # a pipeline: its schedule's planned bubble, the ranks' mean (RunInfo.pipeline)

    def key(self) -> tuple:
        v = self.view
        shown = (v.step, v.n_buckets, v.bucket_cap_mb, tuple(v.marks)) if v else None
        return shown, self.ms_per_cell, self.cap_note, self.cap_since, self.nodes, \
            tuple(self.labels.items()) if self.labels else None, self.plan_pct


class TimelinePane(Widget):
    DEFAULT_CSS = """
    TimelinePane { height: 1fr; min-height: 2; background: #000000; }
    """

    rows_min = staticmethod(geometry.rows_min)
    rows_for = staticmethod(geometry.rows_for)
    rows_max = staticmethod(geometry.rows_max)
    rows_big = staticmethod(geometry.rows_big)

    def __init__(self, strategy: str, layers: list[str], params: list[str], **kw):
        super().__init__(**kw)
        self.strategy = strategy
        self.layer_names = layers
        self.params = [short_param(p) for p in params]
        self.state = PaneState(None, 1.0)
        self._ranks: list[int] = []
        self._node: dict[int, int] = {}
        self.geom = (0, 0)  # (width, height) as of this render: cheaper than self.size per line
        self._cache: dict[tuple, Strip] = {}  # (of the step shown: emptied when the view changes)
        self._fit: tuple[tuple, tuple] = ((-1, None), ([], [], 1, 0, 2))
        self._comm_labels = _MadeOnce(self._comm_label)  # idx -> an AllReduce's label, made once
        self._axis_of: tuple = (None, None)  # ((width, ms per cell), the axis line)
        self._gutters = _MadeOnce(_gutter)  # (rank, lane, first row, host or None, label) -> Segment
        self._groups: tuple = (None, None)  # ((view, scale, names), geometry.LayerGroups or None)

    def set_names(self, layers: list[str], params: list[str]) -> None:
        """Layer and parameter names for labels; redraws only when they changed."""
        short = [short_param(p) for p in params]
        if layers != self.layer_names or short != self.params:
            self.layer_names, self.params = layers, short
            self._groups = (None, None)
            self._cache.clear()
            self._comm_labels.clear()
            self.refresh()

    def render_lines(self, crop):
        self.geom = (self.size.width, self.size.height)
        return super().render_lines(crop)

    # -- state ---------------------------------------------------------------------------
    def show(self, state: PaneState) -> None:
        if state.key() != self.state.key():
            self.refresh()
        if state.view is not self.state.view or state.nodes != self.state.nodes:
            node = dict(state.nodes or ())
            self._ranks = sorted(state.view.spans, key=lambda r: (node.get(r, 0), r)) if state.view else []
            self._node = node
            self._cache.clear()
        self.state = state

    def ranks(self) -> list[int]:
        return self._ranks

    def fit(self) -> tuple[list[int], list[int], int, int, int]:
        """(ranks shown, ranks hidden, rows per lane, blank rows between ranks, first lane row)
        for the height: thicker lanes when there is room, fewer ranks (and a note) when there
        is not; when not even one rank fits under the axis, the lanes go without it (compact:
        the legend still gives the scale, the header says what is hidden)."""
        ranks = self.ranks()
        h = self.geom[1]
        fit_h, fit_ranks_of = self._fit[0]
        if h != fit_h or ranks is not fit_ranks_of:  # (show() makes the list anew for each view)
            got = (*fit_ranks(ranks, h - 2), 2)
            if not got[0] and ranks and h >= 3:
                n = (h - 1) // 2
                got = (ranks[:n], ranks[n:], 1, 0, 1)
            self._fit = (h, ranks), got
        return self._fit[1]

    @property
    def compact(self) -> bool:
        return self.state.view is not None and self.fit()[4] == 1

    @property
    def lane_width(self) -> int:
        return max(0, self.size.width - GUTTER)

    def clear_cache(self) -> None:
        self._cache.clear()

    # -- lines ---------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        width = self.geom[0]
        v = self.state.view
        if y == 0:
            if v is not None and self.fit()[4] == 1:  # compact: no axis; the note goes up here
                return self._compact_header(self.fit()[1], width)
            return self._strip(self._header(width), width)
        if v is None:
            text = [("waiting for the first complete step…", theme.style(theme.DIM))] if y == 1 else []
            return self._strip(text, width)
        shown, hidden, lane_h, gap, top = self.fit()
        if y == 1 and top == 2:
            if not shown and hidden:  # no room for a single rank: say so where the axis goes
                return self._strip([(hidden_note(hidden), theme.style(theme.WARN, bold=True))], width)
            key = (width, self.state.ms_per_cell)
            if self._axis_of[0] != key:  # (the same scale from step to step: made once)
                self._axis_of = key, self._axis(width)
            return self._axis_of[1]
        block = 2 * lane_h + gap
        i, r = divmod(y - top, block)
        if i < len(shown) and r < 2 * lane_h:
            lane, row = divmod(r, lane_h)
            return self._lane(shown[i], lane, width, row, lane_h)
        if hidden and shown and top == 2 and y == top + block * len(shown):
            return self._strip([(hidden_note(hidden), theme.style(theme.WARN, bold=True))], width)
        return Strip.blank(width, _BLANK)

    def _strip(self, parts: list[tuple[str, object]], width: int) -> Strip:
        segs = [Segment(t, s) for t, s in parts]
        return Strip(segs).adjust_cell_length(width, theme.style())

    def _header(self, room: int = 10**6) -> list[tuple[str, object]]:
        """The pane's header line in at most `room` cells where it can: whole parts go, the
        least useful first (the ranks in bands, the blocks drawn a bar, the sampling note, the
        exposed time), never the count of collectives per mesh dimension (`(dp 8 · tp 4)`: the
        one place that says which are which); what still does not fit is cut by the caller."""
        st, v = self.state, self.state.view
        colour = theme.strategy_colour(self.strategy)
        out = [(f" {self.strategy.upper()} ", theme.style("#000000", colour, bold=True))]
        if v is None:
            return out
        figs = [f for f in v.figures.values() if f is not None]
        step_ms = max((f.step_ms for f in figs), default=v.duration_ms)
        calls = figs[0].calls if figs else 0
        colls = figs[0].colls if figs and figs[0].bus_bytes is not None else 0
        exposed = sum(f.exposed_ms for f in figs) / len(figs) if figs else 0.0
        for m in v.marks:  # a bucket cap or a straggler took effect at this step
            tag = ("NEW CAP" if m.startswith("bucket") else "STRAGGLER OFF" if m == "straggler off"
                   else "STRAGGLER ON")
            out.append((f" ⚑ {tag} ", theme.style("#000000", theme.WARN, bold=True)))
        text = f" step {v.step} · {step_ms:.1f} ms"
        if self.strategy == "ddp":
            text += self._buckets(v)
        out.append((text, theme.style(theme.TEXT, bold=True)))
        drop = []  # (index in out, in the order they go)
        bub = [f.bubble_pct for f in figs if getattr(f, "bubble_pct", None) is not None]
        if bub:  # a pipeline: its stages' bubble this step (its microbatches are its marks)
            plan = f" (plan {st.plan_pct:.0f} %)" if st.plan_pct is not None else ""
            out.append((f" · bubble {sum(bub) / len(bub):.0f} %{plan}", theme.style(theme.WARN, bold=True)))
        elif v.sampling is not None:  # layers marked on a sample of steps (short steps)
            drop.append(len(out))
            out.append((f" · {sampling_text(v.sampling, short=True, period=v.period)}", theme.style(theme.WARN)))
        if st.cap_note:
            out.append((f" {st.cap_note}", theme.style(theme.WARN, bold=True)))
        g = self.groups()
        if g is not None:  # (every block is still in the recording and the exports)
            drop.insert(0, len(out))
            out.append((f" · {g.blocks} blocks drawn {min(g.size, g.blocks)} a bar (+ zooms in)",
                        theme.style(theme.WARN)))
        said = (f"{calls - colls} AllReduce + {colls} coll" if calls > colls else f"{colls} collectives") \
            if colls else f"{calls} AllReduce"
        if colls and v.colls:  # (on a device mesh: how many on each of its dimensions)
            said += _by_group(v)
        out.append((f" · {said}", theme.style(theme.TEXT, bold=True)))
        drop.append(len(out))
        out.append((f" · exposed {exposed:.1f} ms", theme.style(theme.TEXT, bold=True)))
        if st.labels:  # aggregated lanes (widgets/aggregate.py)
            drop.insert(0, len(out))
            out.append((f" · {len(v.figures)} ranks in bands", theme.style(theme.DIM)))
        over = sum(len(t) for t, _ in out) - room
        gone = set()
        for i in drop:
            if over <= 0:
                break
            gone.add(i)
            over -= len(out[i][0])
        return [p for i, p in enumerate(out) if i not in gone] if gone else out

    def _compact_header(self, hidden: list[int], width: int) -> Strip:
        """The header with, at its right end, what a compact pane leaves out."""
        note = f" ⚠ {hidden_who(hidden)} hidden · no axis " if hidden else " no axis "
        style = theme.style("#000000", theme.WARN, bold=True) if hidden else theme.style(theme.DIM)
        room = max(0, width - len(note))
        parts = self._header(room)
        while len(parts) > 1 and sum(len(t) for t, _ in parts) > room:
            parts.pop()  # whole parts go, from the right: no number is cut in half
        head = self._strip(parts, width).crop(0, room).adjust_cell_length(room, theme.style())
        return Strip([*head, Segment(note, style)]).crop(0, width)

    def _buckets(self, v: StepView) -> str:
        text = ""
        if v.n_buckets is not None:
            text += f" · {v.n_buckets} bucket{'s' if v.n_buckets != 1 else ''}"
        if v.bucket_cap_mb is not None:
            text += f" · cap {v.bucket_cap_mb:g} MB"
            if self.state.cap_since and not v.marks:
                text += f" (since step {self.state.cap_since})"
        return text

    def _axis(self, width: int) -> Strip:
        lane_w = width - GUTTER
        mpc = self.state.ms_per_cell
        segs = [Segment("      ms ", theme.style(theme.DIM))]
        if lane_w <= 0:
            return Strip(segs).adjust_cell_length(width)
        tick = nice_ceil(mpc * 9)
        cells = ["─"] * lane_w
        marks = []
        t = 0.0
        last_end = -1
        while True:
            x = round(t / mpc)
            if x >= lane_w:
                break
            label = f"{t:g}"
            if x > last_end and x + len(label) <= lane_w:
                marks.append((x, label))
                last_end = x + len(label)
            t += tick
        pos = 0
        dim, bright = theme.style(theme.DIM), theme.style(theme.TEXT, bold=True)
        for x, label in marks:
            if x > pos:
                segs.append(Segment("".join(cells[pos:x]), dim))
            segs.append(Segment(label, bright))
            pos = x + len(label)
        if pos < lane_w:
            segs.append(Segment("─" * (lane_w - pos), dim))
        return Strip(segs, width)

    def _lane(self, rank: int, lane: int, width: int, row: int, rows: int) -> Strip:
        v, mpc = self.state.view, self.state.ms_per_cell
        key = (width, mpc, rank, lane, row, rows)
        cache = self._cache
        got = cache.get(key)
        if got is None:
            if len(cache) >= CACHE_MAX:  # (zooming through many scales: start again)
                cache.clear()
            got = cache[key] = self._draw_lane(v, rank, lane, width, mpc, row, rows)
        return got

    def _draw_lane(self, v: StepView, rank: int, lane: int, width: int, mpc: float,
                   row: int, rows: int) -> Strip:
        spans = v.spans.get(rank, [])
        first = row == 0
        named = self.state.labels.get(rank) if self.state.labels and first else None
        host = self._node.get(rank) if self.state.nodes else None
        gutter = self._gutters[rank, lane, first, host, named[lane] if named is not None else None]
        if lane == 0:
            bars = compute_bars(spans, self.layer_names, self.groups())
            labels = first
        else:  # concurrent AllReduces get the lane's rows (each row labels its own bars)
            bars = comm_bars(spans, self._comm_labels.__getitem__, row, rows, self._coll_of(v, rank))
            labels = True
        lane_w = width - GUTTER
        if lane_w <= 0:
            return Strip([gutter]).crop(0, width)
        return Strip([gutter, *lane_segments(bars, lane_w, mpc, labels=labels)], width)

    def groups(self):
        """How the compute lanes draw consecutive blocks at the scale shown (geometry.group_size
        from the layer spans of the first rank's lane; None: each layer its own bar): made once
        a view and scale, the size in use kept while it still fits (no regrouping at every step)."""
        v, mpc = self.state.view, self.state.ms_per_cell
        if v is None or not v.spans:
            return None
        key = (id(v), mpc, id(self.layer_names))
        if self._groups[0] == key:
            return self._groups[1]
        lane = Lane.of_spans(v.spans[min(v.spans)])
        kind, starts, ends = lane.kind, lane.starts, lane.ends
        layer = [i for i in range(len(kind)) if kind[i] == FWD or kind[i] == BWD]
        cells = sum(ends[i] - starts[i] for i in layer) / mpc if mpc > 0 else 0.0
        last = self._groups[1].size if self._groups[1] is not None else 1
        size = geometry.group_size(self.layer_names, cells, len(layer), last)
        got = self._groups[1] if self._groups[1] is not None and self._groups[1].size == size \
            and self._groups[0][2] == key[2] else geometry.layer_groups(self.layer_names, size)
        self._groups = key, got
        return got

    def _coll_of(self, v: StepView, rank: int):
        """idx -> (colour, label) of a rank's COLL spans (lanes.coll_look), None without any."""
        if not v.colls:
            return None
        table, names = v.coll_table(rank), self.layer_names
        return lambda i: coll_look(table.get(i), names)

    def _comm_label(self, idx: int) -> str:
        if self.strategy == "ddp":
            return f"b{idx}"
        return self.params[idx] if idx < len(self.params) else f"p{idx}"


class _MadeOnce(dict):
    """key -> make(key), made when first asked for (at most 4,096 kept)."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, key):
        if len(self) >= 4096:
            self.clear()
        got = self[key] = self.make(key)
        return got


def _gutter(key: tuple) -> Segment:
    """A lane's gutter: the rank on its compute row, 'comm' (and, multi-node, the rank's host)
    on its comm row, or an aggregated lane's own label (widgets/aggregate.py)."""
    rank, lane, first, host, named = key
    if lane == 0:
        text, style = (f"r{rank:<3}comp " if first else " " * GUTTER), _BRIGHT
    else:
        text = f"n{host:<2} comm " if host is not None else "    comm "
        text, style = (text[:GUTTER] if first else " " * GUTTER), _DIM
    if named is not None:
        text = named[:GUTTER].ljust(GUTTER)
    return Segment(text, style)


def hidden_who(hidden: list[int]) -> str:
    return f"rank {hidden[0]}" if len(hidden) == 1 else f"ranks {hidden[0]}–{hidden[-1]}"


def hidden_note(hidden: list[int]) -> str:
    return f"⚠ {hidden_who(hidden)} hidden — enlarge the terminal"


def _by_group(v: StepView) -> str:
    """' (tp 4 · dp 8)': a step's collectives (COLL spans) per group, its first rank's, where
    any ran on a group other than the default one (a device mesh's dimensions), else ''."""
    if not v.spans:
        return ""
    r = min(v.spans)
    table = v.coll_table(r)
    counts: dict[str, int] = {}
    for i in Lane.of_spans(v.spans[r]).placement().coll_idx:
        row = table.get(i)
        g = group_label(row[4]) if row is not None else WORLD
        counts[g] = counts.get(g, 0) + 1
    if set(counts) <= {WORLD}:
        return ""
    return " (" + " · ".join(f"{g} {n}" for g, n in counts.items()) + ")"
