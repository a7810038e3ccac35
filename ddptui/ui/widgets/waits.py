"""Who waits for whom: per strategy, the rank the others waited for and the layer that made it
late; per rank, its wait (for the others) against the transfer itself over the last steps.
One summary line when that is all the room there is."""
from __future__ import annotations

from ddptui.model import pipeline
from ddptui.model import stragglers
from ddptui.model.store import Store
from . import theme
from .panel import Frame, Panel
from .text import Parts

RECENT = stragglers.RECENT  # steps the medians and bars are over
_RANK, _BAR, _VALUE = theme.style(theme.TEXT, bold=True), theme.style(theme.LANE_COLOURS[theme.WAIT]), theme.style(theme.TEXT)


def _summary(store: Store, strategy: str, upto: int | None) -> dict | None:
    """stragglers.summarize of a strategy's last RECENT steps (kept while they are the same);
    where layers are marked on a sample of steps, its per-layer evidence over the last steps
    that hold RECENT marked ones (the evidence judges those only)."""
    layers = list(store.meta.layers)
    per_layer = not pipeline.pipelined(store.meta, strategy)  # (a pipeline's ranks hold other layers)
    if store.layer_sampling(strategy) is None or not per_layer:
        return stragglers.summarize_cached(store.recent_waits(strategy, upto, RECENT), layers, None, per_layer)
    marked = store.evidence_waits(strategy, upto)[-RECENT:]
    return stragglers.summarize_cached(store.recent_waits(strategy, upto, RECENT), layers, marked)


def _strategies(store: Store) -> list[str]:
    return [s for s in store.strategies() if store.waits_kept(s)]


def summary_line(store: Store, shown: dict) -> Parts:
    """'who waits · naive: rank 1 last 92 % · culprit rank 1 · fc2 backward +40 ms · ddp: …'."""
    parts: Parts = [("who waits ", theme.style(theme.TEXT, bold=True))]
    for s in _strategies(store):
        got = _summary(store, s, shown.get(s))
        if not got:
            continue
        parts.append((f"· {s}: ", theme.style(theme.strategy_colour(s), bold=True)))
        if got["last_arriver_rank"] is None:
            parts.append(("nobody waits ", theme.style(theme.DIM)))
            continue
        parts.append((f"rank {got['last_arriver_rank']} last {got['last_arriver_pct']:.0f} % ", theme.style(theme.TEXT)))
        if got["culprit"]:
            parts.append((f"· culprit {got['culprit']} ", theme.style(theme.WARN, bold=True)))
    note = gathering(store, shown)  # (once, for the strategy with the fewest steps)
    if note:
        parts.append((f"· {note} ", theme.style(theme.DIM)))
    return parts


def compact(store: Store, shown: dict) -> str:
    """The status line's share when the panel has no room (80x24): 'waits: rank 1 last (naive
    100 %, ddp 92 %) · fc2 backward +40 ms', or '' while nobody clearly waits."""
    best = None
    bits = []
    for s in _strategies(store):
        got = _summary(store, s, shown.get(s))
        if got and got["culprit"]:
            bits.append(f"{s} {got['last_arriver_pct']:.0f} %")
            if best is None or got["last_arriver_pct"] > best["last_arriver_pct"]:
                best = got
    if best is None:
        return ""
    culprit = best["culprit"].split(" · ", 1)[-1]
    return f"waits: rank {best['culprit_rank']} last ({', '.join(bits)}) · {culprit}"


def culprit_rank(store: Store, shown: dict, strategy: str) -> int | None:
    """The rank the per-layer evidence names over a strategy's last RECENT steps, or None."""
    if strategy not in _strategies(store):
        return None
    got = _summary(store, strategy, shown.get(strategy))
    return got["culprit_rank"] if got and got["culprit_from"] == "layers" else None


def culprit_gist(store: Store, shown: dict) -> str:
    """The slow rank and section the per-layer evidence names over the last RECENT steps
    ('rank 1 · fc2 backward +40 ms'; the largest excess over the strategies), or ''."""
    best = None
    for s in _strategies(store):
        got = _summary(store, s, shown.get(s))
        c = got and got["evidence"] and got["evidence"]["culprit"]
        if c and (best is None or c["excess_ms"] > best["excess_ms"]):
            best = c
    return best["text"] if best else ""


def gathering(store: Store, shown: dict) -> str:
    """'gathering evidence (3/20 steps)' while a strategy's last RECENT steps are fewer than a
    verdict needs (the one with the fewest), else ''."""
    least = None
    for s in _strategies(store):
        got = _summary(store, s, shown.get(s))
        if got and got.get("gathering") and (least is None or got["evidence_steps"] < least["evidence_steps"]):
            least = got
    return stragglers.gathering_text(least)


def _by_group(got: dict) -> Parts:
    """On a device mesh, who waits most in each dimension's collectives: ' · tp: r1 waits
    81.1 ms · dp: r0 waits 39.6 ms' (medians); nothing without one."""
    out: Parts = []
    for label, waits in (got.get("wait_ms_median_by_group") or {}).items():
        if waits:
            r, v = max(waits.items(), key=lambda x: (x[1], -int(x[0])))
            out.append((f" · {label}: r{r} waits {v:.1f} ms", theme.style(theme.TEXT)))
    return out


def build(store: Store, shown: dict, width: int, rows: int) -> list[Parts]:
    strategies = _strategies(store)
    if not strategies:
        return [[("who waits for whom: needs two or more ranks that communicate", theme.style(theme.DIM))]]
    if rows < 3:
        return [summary_line(store, shown)]
    title = "Who waits for whom"
    gots = {s: _summary(store, s, shown.get(s)) for s in strategies}
    # one scale for every strategy's bars: the longest wait on screen fills a bar (each
    # strategy's own scale, its transfer included, drew 2.1 ms full for naive and 2.6 ms
    # empty for ddp)
    drawn = [g for g in gots.values() if g][:max(0, (rows - 1) // 2)]
    top = max([v for g in drawn if len(g["wait_ms_median"]) <= stragglers.WAITS_LISTED_MAX
               for v in g["wait_ms_median"].values()] or [0.0]) or 1.0
    notes, room = "", width - len(title)
    # what a wait is measured at: each AllReduce, or each collective where any strategy has others
    what = "collective" if any(store.collective_tables(s) for s in strategies) else "AllReduce"
    for clause in (f" · bars: one scale, full {top:.1f} ms", f" · medians of the last {RECENT} steps",
                   f" · wait: own {what} ready, the others not yet",
                   " · transfer: once all are ready"):  # (as many whole clauses as fit)
        if len(notes) + len(clause) > room:
            break
        notes += clause
    lines: list[Parts] = [[(title, theme.style(theme.TEXT, bold=True)), (notes, theme.style(theme.DIM))]]
    for s in strategies:
        got = gots[s]
        if not got or len(lines) + 2 > rows:
            continue
        head: Parts = [(f"{s:<12}", theme.style(theme.strategy_colour(s), bold=True))]
        if got["last_arriver_rank"] is None:
            head.append(("nobody waits", theme.style(theme.DIM)))
        else:
            head.append((f"rank {got['last_arriver_rank']} arrives last in {got['last_arriver_pct']:.0f} % "
                         "of steps", theme.style(theme.TEXT)))
            quiet = f" · {stragglers.gathering_text(got)}" if got.get("gathering") else " · no clear culprit"
            head.append((f" · culprit {got['culprit']}" if got["culprit"] else quiet,
                         theme.style(theme.WARN, bold=True) if got["culprit"] else theme.style(theme.DIM)))
        head += _by_group(got)
        lines.append(head)
        waits = {int(r): v for r, v in got["wait_ms_median"].items()}
        transfer = got["transfer_ms_median"]
        if len(waits) > stragglers.WAITS_LISTED_MAX:  # many ranks: the spread, not a bar each
            lines.append([(f"{'':12}wait ", theme.style(theme.DIM)), (stragglers.wait_spread(got["wait_ms_median"]), theme.style(theme.TEXT)),
                          (f" · transfer {transfer:.1f} ms", theme.style(theme.DIM))])
            continue
        tail = f"· transfer {transfer:.1f} ms"
        bar_w = max(1, min(12, (width - 14 - len(tail)) // max(1, len(waits)) - 12))
        row: Parts = [(f"{'':8}wait, ms ", theme.style(theme.DIM))]
        for r, v in sorted(waits.items()):
            w = min(bar_w, max(0, round(bar_w * v / top)))  # (under half a cell: none drawn)
            row += [(f"r{r} ", _RANK), ("█" * w + " " * (bar_w - w), _BAR), (f" {v:5.1f}  ", _VALUE)]
        row.append((tail, theme.style(theme.DIM)))
        lines.append(row)
    return lines[:rows]


class WaitsPanel(Panel):
    MIN_WIDTH = 60

    @staticmethod
    def rows_min(store: Store) -> int:
        return 1 if _strategies(store) else 0

    @staticmethod
    def rows_max(store: Store) -> int:
        n = len(_strategies(store))
        return 1 + 2 * n if n else 0

    def build_lines(self, frame: Frame) -> list[Parts]:
        return build(frame.store, frame.shown, self.inner[0] or 120, self.inner[1] or 1)
