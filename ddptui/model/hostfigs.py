"""Figures per host (multi-node): for the hosts panel, the headless report and the JSON."""
from __future__ import annotations

from statistics import median

from .store import Store

RECENT = 20


def span_text(ranks: list[int]) -> str:
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}–{ranks[-1]}"
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def host_rows(store: Store, shown: dict) -> list[dict]:
    """Per host (node rank order): node, host, ranks, offset/uncertainty (ns), and medians over
    the recent steps of the first strategy with collectives (DDP first)."""
    hosts = store.hosts()
    offsets = {o["node_rank"]: o for o in store.clock_offsets()}
    strategies = [s for s in store.strategies() if store.waits_kept(s)]
    strategy = "ddp" if "ddp" in strategies else (strategies[0] if strategies else None)
    waits = store.recent_waits(strategy, shown.get(strategy), RECENT) if strategy else []
    out = []
    for node, ranks in sorted(hosts.items()):
        o = offsets.get(node, {})
        row = {"node": node, "host": o.get("host") or "", "ranks": ranks, "strategy": strategy,
               "offset_ns": o.get("offset_ns", 0 if node == 0 else None),
               "uncertainty_ns": o.get("uncertainty_ns", 0 if node == 0 else None),
               "collectives": o.get("collectives", 0),
               "step_ms": None, "exposed_ms": None, "wait_ms": None, "last_pct": None}
        if waits:
            steps, exposed = [], []
            for k in [f.step for f in store.recent_figures(strategy, shown.get(strategy), RECENT, since=1)]:
                figs = [store.rank_figures(strategy, k, r) for r in ranks]
                figs = [f for f in figs if f is not None]
                if figs:
                    steps.append(max(f.step_ms for f in figs))
                    exposed.append(max(f.exposed_ms for f in figs))
            row["step_ms"] = median(steps) if steps else None
            row["exposed_ms"] = median(exposed) if exposed else None
            row["wait_ms"] = median(max(w.wait_ms.get(r, 0.0) for r in ranks) for w in waits)
            row["last_pct"] = 100.0 * sum(1 for w in waits if w.last_arriver in ranks) / len(waits)
        out.append(row)
    return out


