"""A Store's figures shaped for the reports (summary, replay --headless, the JSON): one row per
strategy (`strategy_summary`) and DDP's bucket assignment with parameter names (`bucket_rows`).
Read through the Store's queries."""
from __future__ import annotations

from ranks import spec
from ranks.wire import COMM

from . import collectives
from . import pipeline
from . import figures
from . import hang
from . import stragglers


def strategy_summary(store, strategy: str) -> dict:
    """The figures of a strategy's kept steps (figures.summarize), who waited for whom over them
    (the first step, a warm-up, left out), its overlap per rank as HTA computes it
    (`hta_overlap_pct`: Queries.hta_overlap) and its bucket assignment: one row of the JSON
    `strategies`."""
    with store.lock:  # (one consistent state: the queries below take it again)
        steps = store.step_figures(strategy)
        out = figures.summarize(strategy, steps, int(store.meta.batch or 0), store.world)
        hta = store.hta_overlap(strategy)
        if any(v is not None for v in hta.values()):  # (strategies that communicate)
            out["hta_overlap_pct"] = {str(r): v for r, v in hta.items()}
        stalled, more = store.stalled_steps(strategy)
        if stalled:  # (steps in which a rank waited hang.STALL_S or more: every one of the run)
            out["stalls"] = stall_rows(store, strategy, stalled)
            if more:
                out["stalls_not_listed"] = more
        # who waits for whom, over the kept steps but the first (warm-up)
        waits = store.recent_waits(strategy, n=None)
        per_layer = not pipeline.pipelined(store.meta, strategy)  # (a pipeline's ranks hold other layers)
        marked = store.evidence_waits(strategy) if store.layer_sampling(strategy) is not None and per_layer else None
        out["stragglers"] = stragglers.summarize(waits, list(store.meta.layers), marked, per_layer)
        if strategy == "ddp":
            timing = store.bucket_timing()
            if timing is not None:  # (how its buckets were timed: NCCL's own timing, or a hook)
                out["bucket_timing"] = timing
        captured = store.captured_marks()
        if captured is not None:  # (layer marks inside a CUDA graph's capture: skipped)
            out["cuda_graph_marks"] = {"skipped": captured,
                                       "why": "inside a CUDA graph's capture (its replays run no Python)"}
        traced = store.traced_collectives()
        if traced is not None:  # (collectives torch.compile traced into its graphs: untimed)
            out["traced_collectives"] = traced
        pp = pipeline_summary(store, strategy)
        if pp is not None:  # (a pipeline: its bubble beside its schedule's plan)
            out["pipeline"] = pp
        colls = collective_rows(store, strategy)
        if colls:  # (a strategy with COLL spans: runs without them say nothing new)
            out["collectives"] = colls
        # (a built-in pipeline's microbatches are its marks: its blocks are never marked one by one)
        sampling = store.layer_sampling(strategy) if strategy not in spec.BUILTIN_PIPELINES else None
        if sampling is not None:  # (runs whose every step's layers were marked say nothing new)
            out["layer_marks"] = {"steps_marked": sampling[0], "steps": sampling[1],
                                  "every": store.layer_period(strategy),
                                  "why": "layers marked on a sample of steps (steps too short for a mark "
                                         "per layer, or --layer-every), forward and backward as a whole "
                                         "on the others"}
        buckets = bucket_rows(store, strategy)
        if buckets is not None:
            out["buckets"] = buckets
            out["ddp_reported"] = store.ddp_reported(strategy)
        return out


def pipeline_summary(store, strategy: str) -> dict | None:
    """A pipeline's figures (model/pipeline.py) over the kept complete steps but the first;
    None for a run that is no pipeline."""
    with store.lock:
        info = store.meta.pipeline
        if info is None and strategy not in spec.PIPELINE_STRATEGIES:
            return None
        ks = store.complete_steps(strategy)
        steps = [b for b in (store.step_batches(strategy, k) for k in (ks[1:] if len(ks) > 1 else ks)) if b]
        got = pipeline.summarize(steps, info, list(store.meta.layers))
        if got is not None and strategy in spec.PIPELINE_STRATEGIES:
            got["schedule"] = strategy  # (a run of several: the built-in gpipe and 1f1b)
        return got


def stall_rows(store, strategy: str, stalled: list[tuple]) -> list[dict]:
    """Each stalled step (Queries.stalled_steps) as the JSON says it: {step, step_ms,
    waited_ms: {rank: ms}, waited_for: rank, collective: what it was, named}."""
    with store.lock:
        layers, params = list(store.meta.layers), store.meta.params
        tables = store.collective_tables(strategy)
        out = []
        for k, step_ms, waited, last, kind, idx in stalled:
            out.append({"step": k, "step_ms": step_ms, "waited_ms": {str(r): ms for r, ms in waited.items()},
                        "waited_for": last,
                        "collective": collective_name(store, strategy, k, kind, idx, tables.get(last, {}),
                                                      layers, params)})
        return out


def collective_name(store, strategy: str, step: int, kind: int, idx: int, table: dict, layers: list,
                    params: list) -> str:
    """'DDP bucket 0 AllReduce (layers fc3, fc2; 1.2 MB)', 'AllReduce of fc1.weight',
    'all_gather (h.3, forward; 12.6 MB)': a collective of a step named as a person reads it."""
    def size(nb: int) -> str:
        return f"{nb / 1e6:.1f} MB" if nb >= 1e5 else f"{nb:,} B"
    if kind == COMM:
        assignment = store.bucket_assignment(strategy, step) if strategy == "ddp" else None
        if assignment:
            row = next((a for a in assignment if a[0] == idx), None)
            names = hang.bucket_layers([row], params, layers).get(idx) if row else None
            what = "; ".join(x for x in ((f"layers {hang.layers_text(names)}" if names else ""),
                                          size(row[2]) if row else "") if x)
            return f"DDP bucket {idx} AllReduce" + (f" ({what})" if what else "")
        name = params[idx][0] if 0 <= idx < len(params) else f"parameter {idx}"
        return f"AllReduce of {name}"
    row = table.get(idx)
    if row is None:
        return "a collective (not named in its rank's table)"
    _id, op, nb, _group, _gname, layer, phase, _async = row
    where = ", ".join(x for x in ((layers[layer] if 0 <= layer < len(layers) else ""), phase) if x)
    return f"{op} ({where + '; ' if where else ''}{size(nb)})"


def bucket_rows(store, strategy: str) -> list[dict] | None:
    """Rank 0's newest bucket assignment as {index, params (names), bytes}; None without one."""
    with store.lock:
        assignment = store.bucket_assignment(strategy)
        if assignment is None:
            return None
        names = [str(p[0]) for p in store.meta.params]
        return [{"index": b, "params": [names[i] if i < len(names) else f"param {i}" for i in ps],
                 "bytes": nb} for b, ps, nb in assignment]


def collective_rows(store, strategy: str) -> list[dict] | None:
    """A strategy's collectives by (op, group, phase), and by layer under each (model/collectives.py),
    over its kept complete steps but the first (warm-up); None when none holds a COLL span."""
    with store.lock:
        ks = store.complete_steps(strategy)
        steps = [b for b in (store.step_batches(strategy, k) for k in (ks[1:] if len(ks) > 1 else ks)) if b]
        if not any(collectives.has_colls(b.values()) for b in steps):
            return None
        return collectives.stats(steps, store.collective_tables(strategy), list(store.meta.layers),
                                 store.expected_ranks(strategy),
                                 lambda r, k: store.comm_bytes_fn(strategy, r, k))
