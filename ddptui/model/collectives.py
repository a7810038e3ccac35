"""Every collective of a strategy's steps, grouped by what it was: the `collectives` section of
a summary (model/summary.py), for the strategies whose spans hold COLL spans (a script's own
all_reduce, all_to_all, FSDP's all-gathers and reduce-scatters...). Pure: span batches and the
ranks' collectives tables (Store.collectives) in, rows out.

A row is one (op, group, phase), the group a device mesh's dimension where it is one (`tp`,
`dp`, `dp_shard`: `group_label`; the default group: `world`): how many calls a step makes, their bytes, the median call, how much
of their time no compute hid (a call's exposed time: its span less the rank's forward and
backward), and the bus bandwidth, each call's bytes x its op's ring factor (spec.bus_factor)
over its time. Under it, `layers`: the same per issuing layer (FSDP: per unit). The gradient
AllReduces (COMM spans: DDP's buckets) are a row of their own (`gradients`), so a strategy
with both reads side by side. A COLL span whose idx has no table row is counted as op
"unknown", without bytes.
"""
from __future__ import annotations

import statistics
from functools import lru_cache

from ranks import spec
from ranks.wire import COLL

from . import figures
from .columns import placement

PHASE_ORDER = {p: i for i, p in enumerate(spec.COLL_PHASES)}
OP_ORDER = {op: i for i, op in enumerate(spec.COLL_OPS)}
UNKNOWN = "unknown"
WORLD = "world"
# what the ranks, Kineto traces and synthetic runs call the default group (every rank)
DEFAULT_GROUPS = frozenset({WORLD, "default_pg", "mesh_default", ""})


def group_parts(name: str) -> tuple[str, int | None]:
    """(a group's name, the lowest rank of its instance) from a collectives table row's group:
    a rank names a group of some of the ranks `<name>@<lowest rank>` (ranks/core/colltap.py),
    so that the `tp` group of ranks 0 and 1 and that of ranks 2 and 3 are told apart; None
    where it does not say (the default group, older recordings, Kineto traces)."""
    base, at, low = name.rpartition("@")
    if at and base and low.isdigit():
        return base, int(low)
    return name, None


@lru_cache(maxsize=512)
def group_label(name: str) -> str:
    """What a group is called on screen, in the table and the exports: a device mesh's
    dimension by its own name (`mesh_tp` -> `tp`, `mesh_dp_shard@2` -> `dp_shard`; a Flight
    Recorder dump's `mesh_tp (group 3)` -> `tp (group 3)`), `world` for the default group,
    else the group's name."""
    base = group_parts(name)[0]
    if base in DEFAULT_GROUPS:
        return WORLD
    return base[5:] if base.startswith("mesh_") and len(base) > 5 else base


def with_group(what: str, group: str) -> str:
    """`all_reduce@tp`, `AR@tp`: an op (or its short name) with its group, unless that is
    `world` (a run without a device mesh reads as before)."""
    return what if group == WORLD else f"{what}@{group}"


def has_colls(batches) -> bool:
    """Whether any of these span batches holds a COLL span."""
    return any(placement(b).colls for b in batches)


def _key_of(kind: int, idx: int, table: dict, comm_bytes, world: int) -> tuple:
    """((op, phase, group), layer, bytes, bus factor, group size, gradients?) of one collective."""
    if kind != COLL:
        nb = comm_bytes(idx) if comm_bytes is not None else 0
        return ("all_reduce", "backward", WORLD), -1, nb, spec.bus_factor("all_reduce", world), world, True
    row = table.get(idx) if table else None
    if row is None:
        return (UNKNOWN, "step", WORLD), -1, 0, 0.0, 0, False
    return ((row[1], row[6], group_label(row[4])), row[5], row[2], spec.bus_factor(row[1], row[3]), row[3],
            False)


def stats(steps: list[dict], tables: dict[int, dict], layer_names: list[str], world: int,
          comm_bytes_of=None) -> list[dict]:
    """Rows (see the module's docstring) over `steps`, each {rank: span batch} of one
    complete step; tables: rank -> its collectives table; comm_bytes_of(rank, step) ->
    idx -> bytes of its gradient AllReduces."""
    # (op, phase, group) -> layer -> per step: [calls, bytes, exposed µs, busy µs] summed over ranks
    acc: dict[tuple, dict[int, dict[int, list]]] = {}
    durs: dict[tuple, dict[int, list[int]]] = {}  # every call's duration, µs
    bus: dict[tuple, dict[int, list[float]]] = {}  # [bytes x factor, time µs]
    info: dict[tuple, tuple] = {}  # (op, phase, group) -> (gradients?, group size)
    ranks_in: dict[int, int] = {}
    for n, batches in enumerate(steps):
        ranks_in[n] = len(batches)
        for r, b in batches.items():
            place = placement(b)
            t0, t1 = b.t0, b.t1
            comp = figures.compute_of(b, [(t0[i], t1[i]) for i in place.compute])
            spans = [(t0[i], t1[i]) for i in place.comm]
            over = figures.overlap_each(spans, comp)
            cb = comm_bytes_of(r, b.step) if comm_bytes_of is not None else None
            table = tables.get(r) or {}
            for (a, z), ov, kind, idx in zip(spans, over, place.comm_kind, place.comm_idx):
                key, layer, nb, factor, group, grads = _key_of(kind, idx, table, cb, world)
                d = max(0, z - a)
                cell = acc.setdefault(key, {}).setdefault(layer, {}).setdefault(n, [0, 0, 0, 0])
                cell[0] += 1
                cell[1] += nb
                cell[2] += max(0, d - ov)
                cell[3] += d
                durs.setdefault(key, {}).setdefault(layer, []).append(d)
                bb = bus.setdefault(key, {}).setdefault(layer, [0.0, 0])
                bb[0] += nb * factor
                bb[1] += d
                info.setdefault(key, (grads, group))
    if not acc:
        return []

    def row(per_step: dict[int, list], ds: list[int], bb: list) -> dict:
        every = [per_step.get(n, [0, 0, 0, 0]) for n in range(len(steps))]  # (a step without it: 0)
        per = lambda j: statistics.median(c[j] / max(1, ranks_in[n]) for n, c in enumerate(every))  # noqa: E731
        busy, exposed = per(3), per(2)
        return {"calls_per_step": per(0), "bytes_per_step": per(1),
                "median_ms": statistics.median(ds) / 1e3 if ds else None,
                "time_ms_per_step": busy / 1e3, "exposed_ms_per_step": exposed / 1e3,
                "exposed_pct": 100.0 * exposed / busy if busy > 0 else None,
                "bus_bw_gbps": bb[0] / (bb[1] / 1e6) / 1e9 if bb[1] > 0 and bb[0] > 0 else None}

    def merged(parts: list[dict[int, list]]) -> dict[int, list]:
        out: dict[int, list] = {}
        for p in parts:
            for n, c in p.items():
                got = out.setdefault(n, [0, 0, 0, 0])
                for j in range(4):
                    got[j] += c[j]
        return out

    name = lambda i: layer_names[i] if 0 <= i < len(layer_names) else f"layer {i}"  # noqa: E731
    rows = []
    for key in sorted(acc, key=lambda k: (PHASE_ORDER.get(k[1], 9), info[k][0], OP_ORDER.get(k[0], 99), k)):
        layers = acc[key]
        all_d = [d for ds in durs[key].values() for d in ds]
        bb = [sum(v[0] for v in bus[key].values()), sum(v[1] for v in bus[key].values())]
        out = {"op": key[0], "short": spec.COLL_SHORT.get(key[0], "?"), "phase": key[1], "group": key[2],
               "gradients": info[key][0], "group_size": info[key][1]}
        out.update(row(merged(list(layers.values())), all_d, bb))
        named = sorted(x for x in layers if x >= 0)
        if named:
            out["layers"] = [{"layer": name(x), **row(layers[x], durs[key][x], bus[key][x])} for x in named]
        rows.append(out)
    return rows


def row_label(r: dict) -> str:
    """'all_gather (forward)', 'all_reduce (gradients)', 'all_reduce@tp (forward)': what a
    row says it is (its group unless the default one)."""
    op = with_group(r["op"], r.get("group", WORLD))
    return f"{op} (gradients)" if r.get("gradients") else f"{op} ({r['phase']})"
