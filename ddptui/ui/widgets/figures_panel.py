"""The seeds' comparison table, per strategy: this step, medians of recent steps, how much of
the step is communication, exposed communication and compute, GPU utilisation.

"busy %" is the share of the step the device spent computing (forward and backward:
the union of the compute spans, mean over ranks). It is the per-strategy "GPU utilisation"
that NVML cannot give: NVML reports a device's utilisation over its own sampling period,
and strategies alternate step by step in the same processes. "GPU %" is NVML's (or GPM's
SM activity, where the GPU has it), taken only from samples whose whole period fell inside
one step of that strategy: it needs steps longer than the sampling period, otherwise "–".
"""
from __future__ import annotations

from bisect import bisect_right

from ddptui.model import figures
from ddptui.model.runinfo import simulated_label
from ddptui.model.store import Store
from . import theme
from .panel import Frame, Panel
from .text import Parts

WINDOW = 100  # medians over the last this many complete steps
HISTORY = 30  # steps in the history sparkline

# (title, width, align, key): shown while the panel is wide enough, in this order of priority
COLUMNS = (("strategy", 12, "<", "strategy"), ("step ms", 9, ">", "this"), ("median", 9, ">", "median"),
           ("AR/step", 9, ">", "calls"), ("comm %", 8, ">", "comm_pct"), ("exposed", 9, ">", "exposed"),
           ("exp %", 7, ">", "exposed_pct"), ("overlap", 9, ">", "overlap"), ("busy %", 8, ">", "busy_pct"),
           ("GPU %", 7, ">", "gpu_pct"), ("samples/s", 11, ">", "samples"))
DROP_ORDER = ("samples", "exposed", "median", "gpu_pct", "overlap")  # dropped first when narrow


def recent(store: Store, strategy: str, upto: int | None, n: int = WINDOW) -> list[figures.StepFigures]:
    """Up to n complete steps <= upto, oldest first. DDP: only since the last cap change."""
    since = store.cap_changed_at(upto) if strategy == "ddp" else 0
    return store.recent_figures(strategy, upto, n, since)


def gpu_pct_by_strategy(store: Store) -> dict[str, float]:
    """NVML utilisation (GPM SM activity where present) per strategy, from the samples whose
    period lies within one step of that strategy. Strategies with no such sample are absent."""
    samples = [(s.ts, s.gpus) for s in store.samples()[0]]
    if len(samples) < 2:
        return {}
    out = {}
    for strategy in store.strategies():
        steps = store.step_intervals(strategy)
        starts = [a for _, a, _ in steps]
        got = []
        for (t0, _), (t1, gpus) in zip(samples, samples[1:]):
            if not isinstance(t0, int) or not isinstance(t1, int):
                continue
            i = bisect_right(starts, t0) - 1
            if i < 0 or steps[i][2] < t1:
                continue
            vals = [g.sm_active if g.sm_active is not None else g.util for g in gpus]
            vals = [v for v in vals if v is not None]
            if vals:
                got.append(figures.mean(vals))
        if got:
            out[strategy] = figures.mean(got)
    return out


def compare_rows(store: Store, shown: dict[str, int | None]) -> list[dict]:
    """Per strategy: the summary of its recent steps (figures.summarize) plus this step, shares of
    the step, GPU % and the recent step times."""
    batch, world = int(store.meta.batch or 0), store.world
    gpu = gpu_pct_by_strategy(store)
    rows = []
    for s in store.strategies():
        win = recent(store, s, shown.get(s))
        row = figures.summarize(s, win, batch, world, skip_warmup=True)
        step = row.get("step_ms_median")
        share = (lambda v: None if v is None or not step else 100.0 * v / step)  # noqa: E731
        row.update(this=win[-1].step_ms if win else None, comm_pct=share(row.get("comm_ms")),
                   exposed_pct=share(row.get("exposed_comm_ms")), busy_pct=share(row.get("compute_ms")),
                   gpu_pct=gpu.get(s), history=[f.step_ms for f in win[-HISTORY:]])
        rows.append(row)
    return rows


_FIELD = {"median": "step_ms_median", "calls": "allreduce_calls_per_step", "exposed": "exposed_comm_ms",
          "samples": "samples_per_s", "overlap": "overlap_pct"}  # a column's key -> its row's field


def _cell(row: dict, key: str) -> str:
    if key == "calls" and row.get("collective_calls_per_step") is not None:  # AllReduces + other collectives
        return f"{row.get('allreduce_calls_per_step') or 0:.0f}+{row['collective_calls_per_step']:.0f}"
    if key == "strategy":
        return row["strategy"]
    v = row.get(_FIELD.get(key, key))
    if v is None:
        return "–"
    if key in ("comm_pct", "exposed_pct", "busy_pct", "gpu_pct", "overlap"):
        return f"{v:.0f}%"
    return format(v, {"calls": ".0f", "samples": ",.0f"}.get(key, ".1f"))


def columns_for(width: int) -> list[tuple]:
    """The columns that fit `width` (with room for the sparkline when there is some)."""
    cols = list(COLUMNS)
    for key in DROP_ORDER:
        if sum(c[1] for c in cols) <= width:
            break
        cols = [c for c in cols if c[3] != key]
    return cols


def build(store: Store, shown: dict[str, int | None], width: int = 120, rows: list[dict] | None = None) -> list[Parts]:
    """Lines (as styled parts) of the comparison table for the steps shown."""
    rows = compare_rows(store, shown) if rows is None else rows
    cols = columns_for(width)
    if any(r.get("collective_calls_per_step") is not None for r in rows):  # (AllReduces + other collectives)
        cols = [("AR+coll", *c[1:]) if c[3] == "calls" else c for c in cols]
    used = sum(c[1] for c in cols)
    spark_w = min(HISTORY, width - used - 2)
    head = "".join(f"{name:{al}{w}}" for name, w, al, _ in cols)
    if spark_w >= 8:
        head += f"  step time, last {spark_w}"
    lines: list[Parts] = [[(head, theme.style(theme.DIM, bold=True))]]
    top = max((max(r["history"]) for r in rows if r.get("history")), default=0.0)
    for row in rows:
        s = row["strategy"]
        cells = [_cell(row, key) for *_, key in cols]
        line = [(f"{cells[0]:<12}", theme.style(theme.strategy_colour(s), bold=True)),
                ("".join(f"{c:{al}{w}}" for c, (_, w, al, _) in zip(cells[1:], cols[1:])), theme.style(theme.TEXT))]
        if spark_w >= 8:
            line.append(("  " + theme.spark(row.get("history") or [], 0.0, top or 1.0, width=spark_w),
                         theme.style(theme.strategy_colour(s))))
        lines.append(line)
    lines.append(_notes_line(figures.speedups(rows), width, simulated_label(store.meta)))
    return lines


def _notes_line(sp: dict, width: int, label: str | None = None) -> Parts:
    if label is not None:  # a simulated run: that first, whatever else fits
        tag = f"{label}: figures of a simulation, not measured"
        tag = tag if len(tag) + 20 <= width else "SIMULATED, not measured"
        rest = _notes_line(sp, width - len(tag) - 3)
        return [(tag, theme.style(theme.WARN, bold=True)), (" · ", theme.style(theme.DIM))] + rest
    vs = "  ".join(f"{k[:-10]} {v:.2f}× vs single" for k, v in sp.items() if k.endswith("_vs_single"))
    notes = [f"ms, medians of the last {WINDOW} steps · busy %: device computing, share of the step "
             "(per strategy: NVML cannot split alternating steps) · GPU %: NVML within this strategy's steps",
             f"ms, medians of last {WINDOW} steps · busy %: computing, share of step · GPU %: NVML in its steps",
             f"medians of {WINDOW} steps · busy: computing % of step"]
    text = next((n for n in notes if len(n) + (len(vs) + 3 if vs else 0) <= width), None)
    if vs and text is None:  # (no note fits beside the speed-ups: they go alone, no note cut short)
        return [(vs, theme.style(theme.TEXT))]
    parts: Parts = []
    if vs:
        parts.append((vs + " · ", theme.style(theme.TEXT)))
    parts.append((text or notes[-1], theme.style(theme.DIM)))
    return parts


class FiguresPanel(Panel):
    MIN_WIDTH = 60

    @staticmethod
    def rows_min(store: Store) -> int:
        """A header, a row per strategy, the notes line."""
        return max(1, len(store.strategies())) + 2

    rows_max = rows_min

    def build_lines(self, frame: Frame) -> list[Parts]:
        return build(frame.store, frame.shown, self.inner[0] or 120, frame.rows)
