"""Lane drawing: spans on a time axis -> segments, with eighth-of-a-cell precision.

A lane is rasterised into eighths of a cell (one byte per eighth: a colour id), then
turned into segments run by run, so the cost follows the number of spans, not the width.
A cell holding a boundary is drawn as a left eighth-block: left colour as foreground,
right colour as background. Labels go on bars wide enough to hold them.
"""
from __future__ import annotations

import re
from functools import lru_cache
from operator import itemgetter, lt

from rich.segment import Segment

from ranks import spec
from ranks.wire import BWD, COMM, FWD, MB, MB_PARTS, OPT, OTHER, PASS, PASS_BWD, PASS_FWD, mb_of

from ddptui.model.collectives import group_label, with_group
from ddptui.model.figures import difference, union
from ddptui.model.views import Lane
from . import theme

Bar = tuple[float, float, int, str]  # start ms, end ms, colour id, label ("" = none)
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_DRAWN = (FWD, BWD, OPT, OTHER, PASS)  # (OTHER: a rank's evaluation, in no figure; drawn dim)
_FIXED = {OPT: (theme.OPT, "opt"), OTHER: (theme.OTHER, "other")}  # kind -> colour, label
# PASS: a step whose layers were not marked (sampled): its forward and backward as one bar each
_PASS = {PASS_FWD: (theme.FWD_A, "fwd: all layers"), PASS_BWD: (theme.BWD_A, "bwd: all layers")}
_MB_LABEL = re.compile(r"^(?:s\d+)?[FBIW](\d+)$")  # a microbatch bar's label (_microbatch_plan)
_PLANS: dict = {}  # (Placement, layer names) -> the compute lane's positions, colours, labels
_PLANS_MAX = 256


def _compute_plan(lane: Lane, layer_names: list[str]) -> tuple[list[int], list[int], list[str]]:
    """Which spans a compute lane draws, in what colour, with what label: the same for every
    lane with the same kind and idx columns and layer names, so made once for them."""
    key = (lane.placement(), tuple(layer_names))
    got = _PLANS.get(key)
    if got is None:
        kind, idx, n = lane.kind, lane.idx, len(layer_names)
        if MB in kind:  # a pipeline: a bar per microbatch ("F3", "B3"), as pipeline diagrams draw
            got = _PLANS[key] = _microbatch_plan(kind, idx)
            return got
        pos = [i for i in range(len(kind)) if kind[i] in _DRAWN]
        colours = [_FIXED[kind[i]][0] if kind[i] in _FIXED else _PASS[idx[i] & 1][0] if kind[i] == PASS
                   else (theme.FWD_A if kind[i] == FWD else theme.BWD_A) + (idx[i] & 1) for i in pos]
        labels = [_FIXED[kind[i]][1] if kind[i] in _FIXED else _PASS[idx[i] & 1][1] if kind[i] == PASS
                  else layer_names[idx[i]] if idx[i] < n else f"L{idx[i]}" for i in pos]
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        got = _PLANS[key] = (pos, colours, labels)
    return got


def _microbatch_plan(kind, idx) -> tuple[list[int], list[int], list[str]]:
    """A pipeline stage's lane: each microbatch's forward and backward (its input-grad and
    weight-grad halves apart where the schedule splits them) one bar, labelled with its part
    and number, shaded by microbatch; the optimizer and other time as ever. (Its layers'
    spans, inside those bars, are in the per-layer views.)"""
    pos, colours, labels = [], [], []
    stages = {mb_of(idx[i])[0] for i in range(len(kind)) if kind[i] == MB}
    for i in range(len(kind)):
        k = kind[i]
        if k == MB:
            stage, mb, part = mb_of(idx[i])
            pos.append(i)
            colours.append((theme.FWD_A if part == 0 else theme.BWD_A) + (mb & 1))
            # (a rank of several stages: which one, first: "s3F0")
            labels.append(f"{MB_PARTS[part]}{mb}" if len(stages) == 1 else f"s{stage}{MB_PARTS[part]}{mb}")
        elif k in _FIXED:
            pos.append(i)
            colours.append(_FIXED[k][0])
            labels.append(_FIXED[k][1])
    return pos, colours, labels


def compute_bars(spans, layer_names: list[str], groups=None) -> list[Bar]:
    """Forward and backward per layer (alternating shades, layer labels), the optimizer and
    the rank's "other" time (an evaluation: in no figure, dim), from a Lane (or a list of
    Spans), column-wise. groups (geometry.LayerGroups): consecutive blocks drawn as one bar
    per pass, shaded and labelled by group (`h.0-3`)."""
    lane = Lane.of_spans(spans)
    pos, colours, labels = _compute_plan(lane, layer_names)
    starts, ends = lane.starts, lane.ends
    if groups is not None and MB not in lane.kind:
        bars = _grouped(lane, pos, colours, labels, groups)
    else:
        bars = list(zip(map(starts.__getitem__, pos), map(ends.__getitem__, pos), colours, labels))
    return _waiting(bars, lane.waits) if lane.waits else bars


def _waiting(bars: list[Bar], waits) -> list[Bar]:
    """Bars with the stretches the rank's compute stood waiting for a collective (WAIT) cut
    out of the forward and backward bars and drawn as their own ('wait'): a layer waiting
    for a tensor-parallel all_reduce is not computing."""
    ws = union(waits)
    out: list[Bar] = []
    for a, z, c, t in bars:
        if c in (theme.OPT, theme.OTHER):
            out.append((a, z, c, t))
            continue
        for j, (a1, z1) in enumerate(difference([(a, z)], ws)):
            out.append((a1, z1, c, t if j == 0 else ""))
    out += [(a, z, theme.COMPUTE_WAIT, "wait") for a, z in ws]
    out.sort(key=_FIRST)
    return out


def _grouped(lane: Lane, pos, colours, labels, groups) -> list[Bar]:
    """compute_bars' bars with each group's layers, run after run in time, as one bar: the
    spans of a pass (forward or backward) of layers of one group that follow one another
    (no other group's span between them) are merged, from the first start to the last end."""
    kind, idx, starts, ends = lane.kind, lane.idx, lane.starts, lane.ends
    of, names, n = groups.of, groups.labels, len(groups.of)
    out: list[Bar] = []
    cur = None  # (kind, group, index in out)
    for j in sorted(range(len(pos)), key=lambda j: starts[pos[j]]):
        p = pos[j]
        k = kind[p]
        if k not in (FWD, BWD) or idx[p] >= n:
            out.append((starts[p], ends[p], colours[j], labels[j]))
            continue
        g = of[idx[p]]
        if cur is not None and cur[0] == k and cur[1] == g:
            a, z, c, t = out[cur[2]]
            out[cur[2]] = (a, max(z, ends[p]), c, t)
            continue
        c = (theme.FWD_A if k == FWD else theme.BWD_A) + (g & 1)
        cur = (k, g, len(out))
        out.append((starts[p], ends[p], c, names[g]))
    return out


# start, end, issued, others, last, idx (a COLL span's: -1 - its idx)
Comm = tuple[float, float, "float | None", "float | None", bool, int]


def comm_rows(comms: list[Comm]) -> list[int]:
    """A sub-row per collective (given in start order): the first row free when it starts.
    Backends run several at once (gloo: one per worker thread), so rows = the most in flight."""
    ends: list[float] = []
    rows = []
    for s in comms:
        start = s[0]
        for r, e in enumerate(ends):
            if e <= start:
                ends[r] = s[1]
                rows.append(r)
                break
        else:
            ends.append(s[1])
            rows.append(len(ends) - 1)
    return rows


def overlaps(comms: list[Comm]) -> list[tuple[float, float]]:
    """Stretches where two or more of the collectives run at once."""
    edges = sorted([(s[0], 1) for s in comms] + [(s[1], -1) for s in comms])
    out, depth, since = [], 0, 0.0
    for t, d in edges:
        depth += d
        if d > 0 and depth == 2:
            since = t
        elif d < 0 and depth == 1 and t > since:
            out.append((since, t))
    return out


def coll_look(row, layer_names: list[str]) -> tuple[int, str]:
    """(first colour id, label) of a COLL span from its collectives table row (None: not
    described: the unknown colour, '?'): 'AG h.0', 'RS h.3', 'A2A' (no issuing layer); on a
    device mesh's dimension its name too: 'AR@tp h.0', 'AG@dp h.0'; a Flight Recorder run's,
    whose lanes are its groups, the group once: 'AR group 1'."""
    if row is None:
        return theme.COLL_UNKNOWN, "?"
    op, layer = row[1], row[5]
    short, group = spec.COLL_SHORT.get(op, op), group_label(row[4])
    where = layer_names[layer] if 0 <= layer < len(layer_names) else None
    if where != group:  # (the group said once: a Flight Recorder run's "layers" are its groups)
        short = with_group(short, group)
    label = f"{short} {where}" if where is not None else short
    return theme.COLL_COLOURS.get(op, theme.COLL_OTHER), label


def _unknown_coll(idx: int) -> tuple[int, str]:
    return theme.COLL_UNKNOWN, "?"


def comm_bars(spans, label_of, row: int = 0, rows: int = 1, coll_of=None) -> list[Bar]:
    """Each collective (alternating shades, in time order), after its queued stretch; with
    several ranks, the stretch spent waiting for the last rank to be ready is drawn apart from
    the transfer, and the last arriver's AllReduces have their own colour. From a Lane (or a
    list of Spans), column-wise. label_of(idx): a gradient AllReduce's (COMM) label;
    coll_of(idx) -> (colour, label) of any other collective (COLL, `coll_look`), coloured by
    its op whoever arrived last (the others' waiting shows who that was).

    A lane `rows` tall gives concurrent collectives sub-rows (this is row `row`); what does
    not fit (and, in a one-row lane, every stretch where several run at once) is marked."""
    lane = Lane.of_spans(spans)
    place = lane.placement()
    pos = place.comm
    starts, ends = lane.starts, lane.ends
    if place.colls:  # (COLL spans among them: the idx names a table row, told apart by -1 - idx)
        cidx = [i if k == COMM else -1 - i for k, i in zip(place.comm_kind, place.comm_idx)]
    else:
        cidx = map(lane.idx.__getitem__, pos)
    comms = list(zip(map(starts.__getitem__, pos), map(ends.__getitem__, pos), lane.issued, lane.others,
                     lane.last, cidx))
    comms.sort(key=_FIRST)
    if rows == 1:  # one row: all that matters is whether any two overlap (comm_rows' second row)
        sub = None
        need = 2 if any(map(lt, map(_FIRST, comms[1:]), map(_SECOND, comms))) else 1
    else:
        sub = comm_rows(comms)
        need = max(sub) + 1 if sub else 1
    if need < rows:  # room to spare: each sub-row gets a band of rows, labelled on its first
        band = rows // need
        if not (row % band == 0 and row < band * need):
            label_of = _unlabelled
        row, rows = min(row // band, need - 1), need
    last = rows - 1
    mine = list(enumerate(comms)) if rows == 1 else \
        [(i, s) for i, (s, r) in enumerate(zip(comms, sub)) if min(r, last) == row]
    queued: list[Bar] = []  # (drawn first: a later AllReduce queues while an earlier one runs)
    out: list[Bar] = []
    QUEUED, WAIT, LAST, A = theme.QUEUED, theme.WAIT, theme.COMM_LAST, theme.COMM_A
    for i, (start, end, issued, others, is_last, idx) in mine:
        if issued is not None and issued < start:
            queued.append((issued, start, QUEUED, ""))
        begin = start
        if others is not None and others > start and not is_last:
            # ready here, but the last rank is not: waiting, then the transfer itself
            begin = min(end, others)
            out.append((start, begin, WAIT, ""))
        if idx < 0:  # a COLL span: its op's colour and label
            c, text = (coll_of or _unknown_coll)(-1 - idx)
            out.append((begin, end, c if c == theme.COLL_UNKNOWN else c + (i & 1), text))
            continue
        out.append((begin, end, LAST if is_last else A + (i & 1), label_of(idx)))
    if row == last and need > rows:
        out += [(a, z, theme.COMM_MULTI, "") for a, z in overlaps([s for _, s in mine])]
    return queued + out


def _unlabelled(idx: int) -> str:
    return ""


_FILL = [bytes((c,)) for c in range(len(theme.LANE_COLOURS))]
_BLOCK = [("█" if c else " ") for c in range(len(theme.LANE_COLOURS))]
_FULL = [theme.full_style(c) for c in range(len(theme.LANE_COLOURS))]


_LAYER_COLOURS = frozenset((theme.FWD_A, theme.FWD_A + 1, theme.BWD_A, theme.BWD_A + 1))  # (a layer's bars)
_COLL_FIRST = theme.COLL_AG  # colour ids from here on are collectives' (theme: COLL_AG .. COLL_UNKNOWN)


def raster(bars: list[Bar], width: int, ms_per_cell: float, labels: bool = True) -> tuple[bytearray, list[int], list]:
    """Paint bars (later ones on top) into eighths; every bar gets at least one eighth.
    Returns the eighths, the boundaries (0 and each bar's two ends, in bar order) and
    [(first full cell, colour, label)] of the labelled bars wide enough for their label (and
    a cell either side); with labels=False, none."""
    n = width * 8
    sub = bytearray(n)
    k = 8.0 / ms_per_cell
    edges = [0]
    spans = []
    fill = _FILL
    for a_ms, z_ms, c, label in bars:
        a = int(a_ms * k)
        z = int(z_ms * k + 0.5)
        if not 0 <= a < z <= n:  # (off the lane, or under an eighth: clipped, or one eighth)
            if a >= n:
                continue
            if z <= a:
                z = a + 1
            if z <= 0:
                continue
            if a < 0:
                a = 0
            if z > n:
                z = n
        sub[a:z] = fill[c] * (z - a)
        edges += (a, z)
        if label and labels:
            room = (z >> 3) - ((a + 7) >> 3) - 2
            if room >= len(label):
                spans.append(((a + 7) >> 3, c, label))
            elif c >= _COLL_FIRST and " " in label:  # a collective's 'AG fc2': its op, 'AG', if that fits
                short = label.split(" ", 1)[0]
                if room >= len(short):
                    spans.append(((a + 7) >> 3, c, short))
            elif c in _LAYER_COLOURS and "." in label:  # a layer's 'model.layers.3' (a group's 'h.0-3'): '3' ('0-3')
                short = label.rpartition(".")[2]
                if short and room >= len(short):
                    spans.append(((a + 7) >> 3, c, short))
            elif c in _LAYER_COLOURS and (got := _MB_LABEL.match(label)):
                # a pipeline's microbatch 'F3' (or 's3F3'): its number alone, no margin, as
                # pipeline diagrams number their boxes
                short = got.group(1)
                if room + 2 >= len(short):
                    spans.append(((a + 7) >> 3, c, short))
    return sub, edges, spans


@lru_cache(maxsize=8192)
def _run(colour: int, cells: int) -> Segment:
    """`cells` full cells of one colour (a Segment is made once: the same runs recur)."""
    return Segment(_BLOCK[colour] * cells, _FULL[colour])


@lru_cache(maxsize=4096)
def _label(text: str, colour: int) -> Segment:
    return Segment(text, theme.label_style(colour))


@lru_cache(maxsize=4096)
def _mixed(chunk: bytes) -> Segment:
    left = chunk[0]
    j = 1
    while chunk[j] == left:
        j += 1
    rest = chunk[j:]
    right = max(set(rest), key=rest.count)
    return Segment(theme.LEFT_EIGHTHS[j], theme.mixed_style(left, right))


def lane_segments(bars: list[Bar], width: int, ms_per_cell: float, labels: bool = True) -> list[Segment]:
    """Exactly `width` cells of segments for one lane (with labels, or bars only)."""
    if width <= 0:
        return []
    sub, edges, spans = raster(bars, width, ms_per_cell, labels)
    sub = bytes(sub)  # (its slices are bytes: the chunks' cache keys)
    cuts = {b >> 3 for b in edges}
    cuts.discard(width)
    labs = {}
    for ca, c, text in spans:  # labels whose bar is still visible where they go
        at = ca + 1
        if sub.count(c, at * 8, (at + len(text)) * 8) == len(text) * 8:
            labs[at] = (text, c)
    for at, (text, _) in labs.items():
        cuts.difference_update(range(at + 1, at + len(text)))
        cuts.add(at)
        cuts.add(at + len(text))
    cuts = sorted(cuts)
    if cuts[-1] < width:
        cuts.append(width)
    segs = []
    append = segs.append
    run, lab_get = _run, labs.get
    for c, e in zip(cuts, cuts[1:]):
        c8 = c * 8
        left = sub[c8]
        if sub.count(left, c8, c8 + 8) != 8:  # a boundary in the cell (unless a later bar covered it)
            append(_mixed(sub[c8:c8 + 8]))
            c += 1
            if c >= e:
                continue
            left = sub[c8 + 8]
        lab = lab_get(c)
        if lab is not None:
            append(_label(*lab))
            continue
        append(run(left, e - c))
    return segs
