"""Across nodes: a row per host — its ranks, its clock against node 0's (offset and
uncertainty), and its figures over the last steps: step time (its slowest rank), exposed
communication, how long its ranks waited for the others, and how often the step's last
arriver was one of its ranks. Readable however many ranks there are (lanes may be hidden).
Shown only when ranks run on two or more hosts."""
from __future__ import annotations

from ..store import Store
from . import theme as T
from .panel import Frame, Panel
from .text import Parts

from ..hostfigs import RECENT, host_rows, span_text


def _ms(v) -> str:
    return "–" if v is None else f"{v:.1f}"


def build(store: Store, shown: dict, width: int, rows: int) -> list[Parts]:
    got = host_rows(store, shown)
    strategy = got[0]["strategy"] if got else None
    lines: list[Parts] = [[("Hosts", T.style(T.TEXT, bold=True)),
                           (f" · clocks on node 0's axis · medians of the last {RECENT} {strategy or ''} steps",
                            T.style(T.DIM))]]
    for h in got:
        if len(lines) >= rows:
            break
        off = h["offset_ns"]
        clock = ("clock ?" if off is None else "clock reference" if h["node"] == 0 else
                 f"clock {off / 1e6:+.3f} ms ± {h['uncertainty_ns'] / 1e3:.0f} µs")
        lines.append([(f"node {h['node']:<3}", T.style(T.TEXT, bold=True)),
                      (f"{h['host'][:12]:<13}{span_text(h['ranks']):<12}", T.style(T.TEXT)),
                      (f"{clock:<27}", T.style(T.DIM)),
                      (f"last {'–' if h['last_pct'] is None else format(h['last_pct'], '.0f') + ' %'} · "
                       f"waits {_ms(h['wait_ms'])} · step {_ms(h['step_ms'])} · exposed "
                       f"{_ms(h['exposed_ms'])} ms", T.style(T.TEXT))])
    return lines


class HostsPanel(Panel):
    MIN_WIDTH = 60

    @staticmethod
    def rows_min(store: Store) -> int:
        n = len(store.hosts())
        return 1 + n if n > 1 else 0

    rows_max = rows_min

    def build_lines(self, frame: Frame) -> list[Parts]:
        return build(frame.store, frame.shown, self.inner[0] or 120, self.inner[1] or 3)
