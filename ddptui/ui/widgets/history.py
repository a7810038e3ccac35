"""History: step time, exposed communication and overlap per strategy over the last steps,
as eighth-block column charts (one band per strategy; bands grow with the panel's height)."""
from __future__ import annotations

from ddptui.model import figures
from ddptui.model.store import Store
from . import theme
from .figures_panel import recent
from .panel import Frame, Panel
from .text import Parts

METRICS = (("step time", "ms"), ("exposed comm", "ms"), ("overlap", "%"))
LABEL = 8  # strategy label
VALUE = 7  # last value


def _value(f: figures.StepFigures, metric: str) -> float | None:
    if metric == "step time":
        return f.step_ms
    if metric == "exposed comm":
        return f.exposed_ms
    return figures.overlap_pct(f.comm_ms, f.exposed_ms)


def column_chart(values: list, width: int, rows: int, hi: float) -> list[str]:
    """`rows` lines (top first) of `width` cells: a column per value, right-aligned, in
    eighths of a cell on a 0..hi scale; None draws as '·' on the baseline."""
    vals = list(values)[-width:]
    pad = width - len(vals)
    cols = []
    for v in vals:
        if v is None:
            cols.append(None)
            continue
        cols.append(max(1, round(min(1.0, max(0.0, v / hi if hi > 0 else 0.0)) * rows * 8)))
    out = []
    for r in reversed(range(rows)):
        line = [" "] * pad
        for e in cols:
            if e is None:
                line.append("·" if r == 0 else " ")
            elif e >= (r + 1) * 8:
                line.append("█")
            elif e > r * 8:
                line.append(theme.SPARK[e - r * 8])
            else:
                line.append(" ")
        out.append("".join(line))
    return out


def build(store: Store, shown: dict[str, int | None], width: int, rows: int) -> list[Parts]:
    strategies = store.strategies()
    if not strategies or rows < 2 or width < 3 * (LABEL + VALUE + 4):
        return []
    gap = 2
    block = (width - 2 * gap) // 3
    chart_w = block - LABEL - VALUE
    band = max(1, (rows - 1) // len(strategies))
    series = {s: recent(store, s, shown.get(s), n=chart_w) for s in strategies}
    head: Parts = []
    bodies: list[list[Parts]] = []
    for m, unit in METRICS:
        vals = {s: [_value(f, m) for f in series[s]] for s in strategies}
        top = 100.0 if unit == "%" else max((v for vs in vals.values() for v in vs if v is not None), default=0.0)
        title = f"{m} ({unit})"
        for more in (f" · last {chart_w} steps", f" · top {top:.3g}" if unit == "ms" else ""):
            if len(title + more) <= block:
                title += more
        head.append((f"{title[:block]:<{block}}" + " " * gap, theme.style(theme.TEXT, bold=True)))
        body: list[Parts] = []
        for s in strategies:
            colour = theme.strategy_colour(s)
            last = next((v for v in reversed(vals[s]) if v is not None), None)
            shown_v = "–" if last is None else f"{last:.0f}%" if unit == "%" else f"{last:.1f}"
            for i, line in enumerate(column_chart(vals[s], chart_w, band, top or 1.0)):
                label = s[:LABEL - 1] if i == band - 1 else ""
                val = shown_v if i == band - 1 else ""
                body.append([(f"{label:<{LABEL}}", theme.style(colour, bold=True)), (line, theme.style(colour, theme.TRACK)),
                             (f"{val:>{VALUE}}", theme.style(theme.TEXT)), (" " * gap, theme.style())])
        bodies.append(body)
    lines = [head]
    for i in range(len(bodies[0])):
        lines.append([p for body in bodies for p in body[i]])
    return lines


class HistoryPanel(Panel):
    MIN_WIDTH = 3 * (LABEL + VALUE + 12) + 6
    GROW = True

    @staticmethod
    def rows_min(store: Store) -> int:
        return 1 + max(1, len(store.strategies()))

    @staticmethod
    def rows_max(store: Store) -> int:
        return 1 + 4 * max(1, len(store.strategies()))

    def build_lines(self, frame: Frame) -> list[Parts]:
        w, h = self.inner
        return build(frame.store, frame.shown, w, h)
