"""Across nodes: a row per host — its ranks, its clock against node 0's (offset and
uncertainty), and its figures over the last steps: step time (its slowest rank), exposed
communication, how long its ranks waited for the others, and how often the step's last
arriver was one of its ranks. Readable however many ranks there are (lanes may be hidden).
Shown only when ranks run on two or more hosts."""
from __future__ import annotations

from ddptui.model.store import Store
from . import theme
from .panel import Frame, Panel
from .text import Parts

from ddptui.model.hostfigs import RECENT, host_rows, span_text


def _ms(v) -> str:
    return "–" if v is None else f"{v:.1f}"


def _clock(h: dict) -> str:
    off = h["offset_ns"]
    return ("clock ?" if off is None else "clock reference" if h["node"] == 0 else
            f"clock {off / 1e6:+.3f} ms ± {h['uncertainty_ns'] / 1e3:.0f} µs")


def _figures(h: dict, short: bool) -> str:
    last = "–" if h["last_pct"] is None else format(h["last_pct"], ".0f") + " %"
    if short:
        return f"last {last} · wait {_ms(h['wait_ms'])} · step {_ms(h['step_ms'])} · exp {_ms(h['exposed_ms'])}"
    return (f"last {last} · waits {_ms(h['wait_ms'])} · step {_ms(h['step_ms'])} · exposed "
            f"{_ms(h['exposed_ms'])} ms")


def build(store: Store, shown: dict, width: int, rows: int) -> list[Parts]:
    got = host_rows(store, shown)
    strategy = got[0]["strategy"] if got else None
    lines: list[Parts] = [[("Hosts", theme.style(theme.TEXT, bold=True)),
                           (f" · clocks on node 0's axis · medians of the last {RECENT} {strategy or ''} steps",
                            theme.style(theme.DIM))]]
    got = got[:max(0, rows - 1)]
    # columns as wide as their longest entry (host names cut at 12), so a row fits its panel
    host_w = max((len(h["host"][:12]) for h in got), default=0) + 1
    ranks_w = max((len(span_text(h["ranks"])) for h in got), default=0) + 1
    clock_w = max((len(_clock(h)) for h in got), default=0) + 1
    node_w = max((len(f"node {h['node']}") for h in got), default=0) + 1
    long = max((len(_figures(h, False)) for h in got), default=0)
    short = node_w + host_w + ranks_w + clock_w + long > width
    for h in got:
        lines.append([(f"{'node ' + str(h['node']):<{node_w}}", theme.style(theme.TEXT, bold=True)),
                      (f"{h['host'][:12]:<{host_w}}{span_text(h['ranks']):<{ranks_w}}", theme.style(theme.TEXT)),
                      (f"{_clock(h):<{clock_w}}", theme.style(theme.DIM)),
                      (_figures(h, short), theme.style(theme.TEXT))])
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
