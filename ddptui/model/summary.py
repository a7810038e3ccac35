"""A Store's figures shaped for the reports (summary, replay --headless, the JSON): one row per
strategy (`strategy_summary`) and the bucket layout with parameter names (`bucket_rows`)."""
from __future__ import annotations

from . import figures
from . import stragglers


def strategy_summary(store, strategy: str) -> dict:
    """The figures of a strategy's kept steps (figures.summarize), who waited for whom over them
    (the first step, a warm-up, left out) and its bucket layout: one row of the JSON `strategies`."""
    with store.lock:
        steps = list(store.step_figs.get(strategy, {}).values())
        out = figures.summarize(strategy, steps, int(store.meta.batch or 0), store.world)
        # who waits for whom, over the kept steps but the first (warm-up)
        waits = [w for k, w in store.waits.get(strategy, {}).items() if k > 0]
        out["stragglers"] = stragglers.summarize(waits, list(store.meta.layers))
        buckets = bucket_rows(store, strategy)
        if buckets is not None:
            out["buckets"] = buckets
            out["ddp_reported"] = store.ddp_reported.get((strategy, 0))
        return out


def bucket_rows(store, strategy: str) -> list[dict] | None:
    """Rank 0's newest bucket layout as {index, params (names), bytes}; None without one."""
    with store.lock:
        layout = store.bucket_layout(strategy)
        if layout is None:
            return None
        names = [str(p[0]) for p in store.meta.params]
        return [{"index": b, "params": [names[i] if i < len(names) else f"param {i}" for i in ps],
                 "bytes": nb} for b, ps, nb in layout]
