"""Figures per strategy: this step, medians of recent steps, speedup, step-time history."""
from __future__ import annotations

from .. import figures as F
from ..store import Store
from . import theme as T
from .text import Parts, PartsView

WINDOW = 100  # medians over the last this many complete steps
HISTORY = 30  # steps in the history sparkline

COLUMNS = (("strategy", 12, "<"), ("step ms", 9, ">"), ("median", 9, ">"), ("exposed", 10, ">"),
           ("overlap", 9, ">"), ("AR/step", 9, ">"), ("samples/s", 11, ">"))


def recent(store: Store, strategy: str, upto: int | None) -> list[F.StepFigures]:
    """Up to WINDOW complete steps <= upto, oldest first. DDP: only since the last cap change."""
    since = 0
    if strategy == "ddp":
        since = max((k for k, _ in store.cap_changes if upto is None or k <= upto), default=0)
    out = []
    with store.lock:
        figs = store.step_figs.get(strategy, {})
        for k in reversed(figs):
            if upto is not None and k > upto:
                continue
            if k < since or len(out) >= WINDOW:
                break
            out.append(figs[k])
    out.reverse()
    return out


def _fmt(v, spec: str, na: str = "–") -> str:
    return na if v is None else format(v, spec)


def build(store: Store, shown: dict[str, int | None]) -> list[Parts]:
    """Lines (as styled parts) of the figures table for the steps shown."""
    batch, world = int(store.meta.get("batch") or 0), store.world
    head = "".join(f"{name:{al}{w}}" for name, w, al in COLUMNS) + f"  step time, last {HISTORY}"
    lines: list[Parts] = [[(head, T.style(T.DIM, bold=True))]]
    rows, hists = [], {}
    for s in store.strategies():
        win = recent(store, s, shown.get(s))
        row = F.summarize(s, win, batch, world, skip_warmup=True)
        rows.append(row)
        hists[s] = [f.step_ms for f in win[-HISTORY:]]
        this = win[-1].step_ms if win else None
        overlap = row.get("overlap_pct")
        cells = (s, _fmt(this, ".1f"), _fmt(row.get("step_ms_median"), ".1f"),
                 _fmt(row.get("exposed_comm_ms"), ".1f"), "–" if overlap is None else f"{overlap:.0f}%",
                 _fmt(row.get("allreduce_calls_per_step"), ".0f"), _fmt(row.get("samples_per_s"), ",.0f"))
        lines.append([(f"{cells[0]:<12}", T.style(T.strategy_colour(s), bold=True)),
                      ("".join(f"{c:{al}{w}}" for c, (_, w, al) in zip(cells[1:], COLUMNS[1:])),
                       T.style(T.TEXT))])
    top = max((max(h) for h in hists.values() if h), default=0.0)
    for line, s in zip(lines[1:], store.strategies()):
        line.append(("  " + T.spark(hists[s], 0.0, top or 1.0), T.style(T.strategy_colour(s))))
    lines.append(_speedup_line(F.speedups(rows)))
    return lines


def _speedup_line(sp: dict) -> Parts:
    parts: Parts = []
    v = sp.get("ddp_vs_naive")
    if v is None:
        parts.append(("DDP vs naive: – (needs both)", T.style(T.DIM)))
    else:
        colour = T.GOOD if v >= 1 else T.ERROR
        parts.append(("DDP vs naive: ", T.style(T.TEXT, bold=True)))
        word = "(same)" if abs(v - 1) < 0.005 else "faster" if v > 1 else "slower"
        parts.append((f"{v:.2f}× {word}", T.style(colour, bold=True)))
    for k, v in sp.items():
        if k.endswith("_vs_single"):
            parts.append((f"  {k[:-10]} {v:.2f}× vs single", T.style(T.DIM)))
    parts.append((f"   times in ms · medians of the last {WINDOW} steps", T.style(T.DIM)))
    return parts


class FiguresPanel(PartsView):
    DEFAULT_CSS = """
    FiguresPanel { height: 100%; width: 1fr; background: #000000; padding: 0 1; }
    """

    @staticmethod
    def wanted_rows(store: Store) -> int:
        """A header, a row per strategy, the speedup line."""
        return max(1, len(store.strategies())) + 2
