"""DDP's buckets at the step shown: which layers each holds, its size, how long its
AllReduce ran and how much of that ran while the rank computed (forward/backward)."""
from __future__ import annotations

from ddptui.model.store import Store
from ddptui.model.views import StepView
from . import theme
from .panel import Frame, Panel
from .text import Parts


LAYERS_WIDTH = 13  # the layers column (and a space)


def _short(name: str) -> str:
    """A layer's name as its last dotted part ('classifier'), with its parent's where that part
    is an index ('layer.3')."""
    parts = name.split(".")
    return ".".join(parts[-2:]) if len(parts) > 1 and parts[-1].isdigit() else parts[-1]


def layer_text(params: list[int], param_layer: list[int], layer_names: list[str],
               width: int = LAYERS_WIDTH, counted: bool = True) -> str:
    """The layers a bucket holds, in at most `width` characters, never cut mid-name: 'fc4–fc5'
    for contiguous layers, 'fc1,fc3' otherwise; when that does not fit, the last parts of the
    names ('layer.3–layer.6'), 'all 7 layers' for a bucket of every layer, else '4 layers'."""
    layers = sorted({param_layer[p] for p in params if p < len(param_layer)})
    name = (lambda i: layer_names[i] if i < len(layer_names) else f"L{i}")  # noqa: E731
    if not layers:
        return "?"
    n = len(layers)
    contiguous = layers == list(range(layers[0], layers[-1] + 1))
    if n == 1:
        full = name(layers[0])
        tries = [full, _short(full), "…" + full[-(width - 1):]]
    elif contiguous:
        a, b = name(layers[0]), name(layers[-1])
        pa, pb = a.split("."), b.split(".")
        k = 0
        while k < min(len(pa), len(pb)) - 1 and pa[k] == pb[k]:
            k += 1
        tail = ".".join(pb[k:])  # b after what it shares with a ('3' of 'bert.encoder.layer.3')
        count = f" ({n} layers)" if n > 2 and counted else ""
        tries = ([f"{a}…{b}{count}"] if count else []) + [f"{a}–{b}", f"{_short(a)}–{tail}{count}", f"{_short(a)}–{tail}",
                 f"{_short(a)}–{_short(b)}"]
        if layers[0] == 0 and layers[-1] == len(layer_names) - 1:
            tries.append(f"all {n} layers")
    else:
        tries = [",".join(name(i) for i in layers), ",".join(_short(name(i)) for i in layers)]
    return next((t for t in tries if len(t) <= width), f"{n} layers")


def bucket_rows(store: Store, view: StepView, assignment: list) -> list[tuple[int, list[int], float, float | None, float | None]]:
    """(bucket, params, MB, time ms, overlap %) per bucket, means over the ranks (the store's
    per-step figures: computed once per step, not per frame)."""
    figs = store.bucket_figures(view.strategy, view.step) or {}
    out = []
    for b, params, nbytes in assignment:
        t, ov = figs.get(b, (None, None))
        out.append((int(b), list(params), nbytes / 2**20, t, ov))
    return out


_LABELS: list = [None, None, None, None]  # (params, layer names, key, labels) of the last table


def _layer_labels(params: list, layer_names: list[str], buckets: list[list[int]], wide: int) -> list[str]:
    """The layers column of buckets' rows (layer_text: 13 characters, or up to `wide` where
    the short form cuts the names): the same while the run's names and the bucket assignment
    are (a cap's change), so made once for them, not every frame."""
    key = (tuple(map(tuple, buckets)), wide)
    got = _LABELS
    if got[0] is params and got[1] is layer_names and got[2] == key:
        return got[3]
    param_layer = [int(p[2]) if len(p) > 2 else 0 for p in params]
    names = list(layer_names)
    labels = [layer_text(ps, param_layer, names) for ps in buckets]
    labels = [x if x == layer_text(ps, param_layer, names, 1 << 20, counted=False)
              else layer_text(ps, param_layer, names, wide) for x, ps in zip(labels, buckets)]
    _LABELS[:] = params, layer_names, key, labels
    return labels


def build(store: Store, view: StepView | None, rows: int, width: int = 52) -> list[Parts]:
    if view is None:
        return [[("DDP buckets: waiting for a DDP step…", theme.style(theme.DIM))]]
    assignment = store.bucket_assignment("ddp", view.step) or []
    cap = f" · cap {view.bucket_cap_mb:g} MB" if view.bucket_cap_mb is not None else ""
    lines: list[Parts] = [
        [(f"DDP buckets · step {view.step}{cap}", theme.style(theme.TEXT, bold=True)),
         (" · in the order DDP reduces them", theme.style(theme.DIM))]]
    got = bucket_rows(store, view, assignment)
    room = max(0, rows - 2)
    show = got if len(got) <= room else got[:max(0, room - 1)]
    # the layers column: 13 characters, wider where the panel has room and a name needs it
    wide = max(LAYERS_WIDTH, width - 8 - 8 - 10 - 9 - 1)
    labels = _layer_labels(store.meta.params, store.meta.layers, [ps for _, ps, _, _, _ in show], wide)
    col = max([LAYERS_WIDTH] + [len(x) for x in labels]) + 1
    lines.append([(f"{'bucket':<8}{'layers':<{col}}{'MB':>8}{'time ms':>10}{'overlap':>9}",
                 theme.style(theme.DIM, bold=True))])
    for (b, ps, mb, t, ov), label in zip(show, labels):
        lines.append([(f"b{b:<7}", theme.style(theme.LANE_COLOURS[theme.COMM_A + (b & 1)], bold=True)),
                      (f"{label:<{col}}{mb:>8.2f}"
                       f"{'–' if t is None else f'{t:.2f}':>10}{'–' if ov is None else f'{ov:.0f}%':>9}",
                       theme.style(theme.TEXT))])
    if len(show) < len(got):
        lines.append([(f"… {len(got) - len(show)} more buckets", theme.style(theme.WARN))])
    return lines


class BucketsPanel(Panel):
    MIN_WIDTH = 52

    @staticmethod
    def rows_min(store: Store) -> int:
        if "ddp" not in store.strategies():
            return 0
        n = store.bucket_count("ddp")
        return min(2 + n, 5) if n else 0

    @staticmethod
    def rows_max(store: Store) -> int:
        if "ddp" not in store.strategies():
            return 0
        return 2 + store.bucket_count("ddp")

    def build_lines(self, frame: Frame) -> list[Parts]:
        return build(frame.store, frame.views.get("ddp"), self.inner[1], self.inner[0])
