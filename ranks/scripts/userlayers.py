"""Which modules of a user's model are its layers (`choose_layers`), and the module hooks that
time each chosen layer's forward and backward through a UserRecorder (ddptui.instrument)."""
from __future__ import annotations

import torch
import torch.nn as nn

from ranks.core import markop
from ranks.core.instrument import Recorder, StepRecord, letting_go
from ranks.wire import BWD, FWD, OTHER

CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)
UNCALLED = (nn.ModuleList, nn.ModuleDict)


# -- which modules are layers ----------------------------------------------------------------
AUTO_MIN_BLOCKS = 4


def _n_params(mod: nn.Module) -> int:
    return sum(p.numel() for p in mod.parameters())


def _children(prefix: str, mod: nn.Module) -> list[tuple[str, nn.Module]]:
    """A module's children, containers (ModuleList/Sequential/ModuleDict) opened."""
    out = []
    for n, ch in mod.named_children():
        if isinstance(ch, CONTAINERS) and len(ch):
            out += _children(f"{prefix}{n}.", ch)
        else:
            out.append((f"{prefix}{n}", ch))
    return out


def _today_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """A model without repeated blocks: start from the model's children (containers opened);
    while fewer than AUTO_MIN_BLOCKS of them hold parameters, or those hold under half of the
    model's, open the one with children that holds the most parameters (a LightningModule ->
    its model -> its modules). A level that already has them is kept whole, even where one
    module holds most parameters."""
    total = _n_params(model)
    level = _children("", model)
    for _ in range(64):
        sizes = [_n_params(m) for _, m in level]
        held = [n for n in sizes if n]
        if len(held) >= AUTO_MIN_BLOCKS and sum(held) * 2 >= total:
            break
        openable = [i for i, (_, m) in enumerate(level) if any(True for _ in m.children())]
        if not openable:
            break
        i = max(openable, key=lambda j: sizes[j])
        name, mod = level[i]
        level[i:i + 1] = _children(name + ".", mod)
    return level or [("model", model)]


STAGE_SHARE = 0.5  # stages: blocks whose own list of blocks holds at least this share of them


def _repeated(mod: nn.Module) -> bool:
    """A list of repeated blocks: a ModuleList or Sequential of two or more modules of one
    type that hold parameters."""
    if not isinstance(mod, (nn.ModuleList, nn.Sequential)) or len(mod) < 2:
        return False
    kids = list(mod.children())
    t = type(kids[0])
    return all(type(k) is t for k in kids) and _n_params(mod) > 0


def _block_lists(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost lists of repeated blocks (path, list), in registration order."""
    out: list[tuple[str, nn.Module]] = []
    seen: set[int] = set()

    def walk(prefix: str, mod: nn.Module) -> None:
        for n, ch in mod.named_children():
            if id(ch) in seen:  # (a module shared under two names: looked at once)
                continue
            seen.add(id(ch))
            if _repeated(ch):
                out.append((prefix + n, ch))
            else:
                walk(f"{prefix}{n}.", ch)
    if _repeated(model):
        return [("", model)]
    walk("", model)
    return out


def _stage_lists(path: str, lst: nn.Module) -> list[tuple[str, nn.Module]] | None:
    """The inner block lists of a list of stages, or None when its blocks are not stages. A
    stage (Swin's, ConvNeXt's, a ResNet's) is a block whose own child of one name, in every
    block of the list, is a list of blocks of one type holding STAGE_SHARE of the stages'
    parameters (with a downsampling module beside it); a decoder layer whose experts sit a
    level deeper (a mixture of experts) stays one block."""
    kids = list(lst.named_children())
    for attr, first in kids[0][1].named_children():
        if not isinstance(first, (nn.ModuleList, nn.Sequential)) or "expert" in attr.lower():
            continue  # (a layer's own list of experts: they run side by side, not one after another)
        inner = []
        for n, b in kids:
            c = getattr(b, attr, None)
            if not isinstance(c, (nn.ModuleList, nn.Sequential)):
                break
            ts = {type(k) for k in c.children()}
            if len(ts) > 1:
                break
            inner.append((f"{path}.{n}.{attr}" if path else f"{n}.{attr}", c))
        else:
            if sum(_n_params(c) for _, c in inner) >= STAGE_SHARE * _n_params(lst):
                return inner
    return None


def auto_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """layers="auto": the model opened to its repeated blocks, at whatever depth they sit.
    The lists (ModuleList, Sequential) of same-type blocks are found (the outermost ones);
    a list of stages (each stage's own list of blocks holds most of it: `_stage_lists`) is
    opened to the stages' blocks. Each block is a layer (`bert.encoder.layer.3`, both
    `encoder.block.N` and `decoder.block.N` of an encoder-decoder), and around them every
    module beside the path to a list is a layer of its own (embeddings, norms, heads, a
    stage's downsampling), a module holding no parameters none. A model without repeated
    blocks keeps `_today_layers`."""
    lists = _block_lists(model)
    if not lists:
        return _today_layers(model)
    chosen: dict[int, str] = {}
    openers: set[int] = set()  # the modules on the way to a chosen list
    todo = []
    for path, lst in lists:  # (stages are opened once: a bottleneck's own convolutions stay in it)
        inner = _stage_lists(path, lst)
        todo += [(p, c) for p, c in inner if len(c)] if inner else [(path, lst)]
    for path, lst in todo:
        chosen[id(lst)] = path
        parts = path.split(".") if path else []
        for k in range(len(parts)):
            openers.add(id(model.get_submodule(".".join(parts[:k]))))
    out: list[tuple[str, nn.Module]] = []

    def emit(prefix: str, mod: nn.Module) -> None:
        for n, ch in mod.named_children():
            path = prefix + n
            if id(ch) in chosen:
                out.extend((f"{path}.{i}", b) for i, b in ch.named_children() if _n_params(b))
            elif id(ch) in openers:
                emit(path + ".", ch)
            elif _n_params(ch):
                out.append((path, ch))
    if id(model) in chosen:
        out.extend((i, b) for i, b in model.named_children() if _n_params(b))
    else:
        emit("", model)
    return out or _today_layers(model)


# the attribute torch.compile's OptimizedModule keeps the user's module under: not part of
# the names the user wrote
_COMPILED = "_orig_mod"


def shown_name(name: str) -> str:
    """A module's or parameter's name as the user wrote it: torch.compile's `_orig_mod.`
    segments left out (`_orig_mod.transformer.h.0` -> `transformer.h.0`)."""
    if _COMPILED not in name:
        return name
    return ".".join(p for p in name.split(".") if p != _COMPILED) or name


def choose_layers(model: nn.Module, layers="auto") -> list[tuple[str, nn.Module]]:
    """(name, module) of the modules to time, in registration order; ValueError if none or
    a name is unknown. One module reachable under several names is chosen once."""
    out: list[tuple[str, nn.Module]] = []
    if isinstance(layers, str) and layers == "auto":
        out = auto_layers(model)
    elif isinstance(layers, int) and not isinstance(layers, bool):
        if layers < 1:
            raise ValueError(f"layers depth must be at least 1 (got {layers})")

        def at(prefix, mod, d):
            for n, ch in mod.named_children():
                name = f"{prefix}{n}"
                if d == layers or not any(True for _ in ch.children()):
                    out.append((name, ch))
                else:
                    at(name + ".", ch, d + 1)
        at("", model, 1)
        if not out:
            out = [("model", model)]
    elif isinstance(layers, (list, tuple)) and layers and all(isinstance(n, str) for n in layers):
        known = dict(model.named_modules(remove_duplicate=False))
        for k, m in list(known.items()):  # (a compiled model's modules by the user's names too)
            known.setdefault(shown_name(k), m)
        for n in layers:
            if n not in known:
                near = [k for k in known if k and k.split(".")[-1] == n.split(".")[-1]][:3]
                hint = f" (did you mean {', '.join(near)}?)" if near else ""
                raise ValueError(f"the model has no module {n!r}{hint}")
            out.append((n, known[n]))
    else:
        raise ValueError(f"layers must be 'auto', a depth or a list of module names (got {layers!r})")
    seen: set[int] = set()
    uniq = []
    for n, m in out:
        if id(m) not in seen:  # a shared module (or a name given twice): one layer
            seen.add(id(m))
            uniq.append((n, m))
    if len(uniq) > 0xFFFF:
        raise ValueError(f"{len(uniq)} layers is more than ddptui draws")
    return uniq


_graph_task = torch._C._current_graph_task_id  # -1 outside a backward


class UserStep(StepRecord):
    """A step of a user's model: the slots of its current micro-step (StepRecord's), the spans
    of its earlier micro-steps (`micro`: (kind, layer, start, end) marks), each layer's first
    forward start over the whole step (`first_fwd`, for the layers' forward order) and whether
    any earlier micro-step had a backward (`had_bwd`)."""

    __slots__ = ("micro", "first_fwd", "had_bwd", "loose")


class UserRecorder(Recorder):
    """Recorder for modules that may run more than once a step, and for steps of several
    micro-steps (gradient accumulation): within a micro-step, a layer's span goes from its
    first start to its last end (the workers' blocks run once); `micro()` closes a
    micro-step, its spans kept in the step. Layers may be added between steps (a second
    DDP module of the same rank: `add_layers`)."""

    def __init__(self, clock, n_layers: int):
        super().__init__(clock, n_layers)
        # a CUDA mark costs µs of host time: there, a layer's backward end is marked at its
        # first call and from the number of calls the layer made the last time it ran (the
        # Recorder's rule); on CPU every call is marked (a clock read), so a layer that makes
        # fewer calls than before (a conditional input, a block used once instead of twice)
        # keeps its exact end
        self._count_bwd = clock.cuda
        # which layer is running (a collective issued now is attributed to it): the forward's
        # open layers, innermost last, and the last layer whose backward began
        self._fwd_open: list[int] = []
        self._bwd_at = -1

    def at(self) -> int:
        """The layer running now (internal index), -1 for none: in a backward, the last layer
        whose backward began; else the innermost layer whose forward is open."""
        if _graph_task() != -1:
            return self._bwd_at
        return self._fwd_open[-1] if self._fwd_open else -1

    def phase(self) -> str:
        """What the step is doing now (spec.COLL_PHASES)."""
        if _graph_task() != -1:
            return "backward"
        c = self.cur
        if c is None:
            return "step"
        if c.opt_s is not None and c.opt_e is None:
            return "optimizer"
        if self._fwd_open:
            return "forward"
        # between layers: in the forward while this micro-step has a forward and no backward
        # (a collective between two DDP modules of one model), else the step's own
        n = self.n_layers
        if c.fwd_s.count(None) < n and c.bwd_s.count(None) == n and c.bwd_e.count(None) == n:
            return "forward"
        return "step"

    def add_layers(self, n: int) -> None:
        """n more layers (between steps only)."""
        self.n_layers += n
        self._bwd_calls += [None] * n

    def begin(self, strategy: str, step: int) -> None:
        self.cur = c = UserStep(strategy, step, self.n_layers)
        c.micro, c.first_fwd, c.had_bwd, c.loose = [], None, False, None
        self._fwd_open, self._bwd_at = [], -1
        self.clock.begin_step()
        c.ref = self.clock.cal
        c.step_start = self.clock.mark()

    def fwd_begin(self, layer: int) -> None:
        c = self.cur
        if c is not None:
            self._fwd_open.append(layer)
            if c.fwd_s[layer] is None:
                c.fwd_s[layer] = self.clock.mark()

    def fwd_end(self, layer: int) -> None:
        c = self.cur
        if c is not None:
            self._mark_again(c.fwd_e, layer)
            op = self._fwd_open
            if op and op[-1] == layer:
                op.pop()
            elif layer in op:
                op.remove(layer)

    def bwd_begin(self, layer: int) -> None:
        c = self.cur
        if c is not None:
            self._bwd_at = layer
            if c.bwd_s[layer] is None:
                c.bwd_s[layer] = self.clock.mark()

    def bwd_end(self, layer: int) -> None:
        c = self.cur
        if c is None:
            return
        if self._count_bwd:
            n = c.bwd_n[layer] = c.bwd_n[layer] + 1
            want = self._bwd_calls[layer]
            if not (want is None or n == 1 or n >= want):
                return
        self._mark_again(c.bwd_e, layer)

    def opt_begin(self) -> None:
        if self.cur is not None:
            super().opt_begin()

    def opt_end(self) -> None:
        if self.cur is not None:
            super().opt_end()

    # -- micro-steps (between hooks, never inside one) -----------------------------------
    def bwd_since(self) -> bool:
        """Has a backward run in the current micro-step?"""
        c = self.cur
        n = self.n_layers
        return c.bwd_s.count(None) < n or c.bwd_e.count(None) < n

    def micro(self) -> None:
        """Close the open step's current micro-step: its layer spans are kept in the step,
        the slots cleared for the next one."""
        c = self.cur
        n = self.n_layers
        fs, fe, bs, be = c.fwd_s, c.fwd_e, c.bwd_s, c.bwd_e
        if c.first_fwd is None:
            c.first_fwd = list(fs)
        else:
            first = c.first_fwd
            for i, t in enumerate(fs):
                if first[i] is None:
                    first[i] = t
        out = c.micro
        loose = [] if self.clock.cuda else None
        for i in range(n):
            if fs[i] is not None and fe[i] is not None:
                out.append((FWD, i, fs[i], fe[i]))
            elif loose is not None:
                loose += [t for t in (fs[i], fe[i]) if t is not None]
        for i in reversed(range(n)):
            if bs[i] is not None and be[i] is not None:
                out.append((BWD, i, bs[i], be[i]))
                c.had_bwd = True
            elif loose is not None:
                loose += [t for t in (bs[i], be[i]) if t is not None]
        if loose:
            c.loose = (c.loose or []) + loose
        calls = self._bwd_calls
        for i, k in enumerate(c.bwd_n):
            if k:
                calls[i] = k
        c.fwd_s, c.fwd_e, c.bwd_s, c.bwd_e = [None] * n, [None] * n, [None] * n, [None] * n
        c.bwd_n = [0] * n

    def discard(self, keep_start: bool = False):
        """Drop the open step (it synchronised nothing: not a step). keep_start: its start
        mark and its OTHER spans are kept and returned, (start, [(OTHER, 0, a, z)...]), for
        the step that follows (what ran was an evaluation: OTHER time)."""
        c, self.cur = self.cur, None
        if c is None:
            return None, []
        kept = [m for m in c.micro if m[0] == OTHER] if keep_start else []
        if self.clock.cuda:
            keep = {id(t) for m in kept for t in m[2:]}
            if keep_start:
                keep.add(id(c.step_start))
            self._release_all(c, keep)
        return (c.step_start if keep_start else None), kept

    def drop_last(self) -> None:
        """Drop the step just ended (it synchronised nothing: not a step)."""
        c = self.pending.pop()
        if self.clock.cuda:
            self._release_all(c)

    def _release_all(self, c, keep=(), more=()) -> None:
        """Recorder's, with the events of the step's earlier micro-steps, its layers' first
        forward starts and its loose marks."""
        super()._release_all(c, keep, (*(c.first_fwd or ()), *(c.loose or ()),
                                       *(t for m in c.micro for t in m[2:]), *more))

    def _resolve(self, r, yield_every: int = 0) -> tuple:
        return _one_moment(self._resolve_all(r, yield_every))

    def _resolve_all(self, r, yield_every: int = 0) -> tuple:
        frozen = r.micro
        if not frozen and r.first_fwd is None:
            return super()._resolve(r, yield_every)
        # (before the step's own events go back to the pool; off the training thread, letting
        # go of the GIL as the step's own marks do: with accumulation most marks are here)
        ns = letting_go(self.clock.resolver(r.step_start, r.ref), yield_every)
        extra = [(k, i, ns(a), ns(b)) for k, i, a, b in frozen]
        # (every event of the step, these too, back to the pool there: _release_all)
        s, k, base, kinds, idxs, t0s, t1s, iss = super()._resolve(r, yield_every)
        if extra:  # the earlier micro-steps' spans, after the STEP span, in the order they ran
            kinds = kinds[:1] + [e[0] for e in extra] + kinds[1:]
            idxs = idxs[:1] + [e[1] for e in extra] + idxs[1:]
            t0s = t0s[:1] + [e[2] for e in extra] + t0s[1:]
            t1s = t1s[:1] + [e[3] for e in extra] + t1s[1:]
            base = min(base, min(e[2] for e in extra))  # (OTHER spans may come before the step)
        return (s, k, base, kinds, idxs, t0s, t1s, iss)


SAME_MOMENT_NS = 1_000_000  # (a core taken from the hooks between them: 0.4 ms seen)


def _one_moment(item: tuple) -> tuple:
    """A resolved step whose backward spans meet where one layer's input gradient is the next
    one's output gradient: both layers' hooks on that one tensor (the lower's start registered
    first, so run first) mark the one moment a few µs apart (2-21 µs on 2 CPU cores, 0.4 ms
    once), the lower layer's start before the upper's end. The upper's end is taken back to the lower's start
    (an overlap of up to SAME_MOMENT_NS: more is left as it was), so the spans follow one
    another, as the profiler and the exports' tracks have them."""
    s, k, base, kinds, idxs, t0s, t1s, iss = item
    bw = sorted((t0s[j], j) for j, kd in enumerate(kinds) if kd == BWD)
    for (_, a), (b0, _b) in zip(bw, bw[1:]):
        if b0 < t1s[a] <= b0 + SAME_MOMENT_NS and t0s[a] <= b0:
            t1s[a] = b0
    return item


def _tensors(obj, out: list, depth: int = 0) -> list:
    """The tensors needing a gradient in a module's inputs or output (tuples, lists, dicts)."""
    if isinstance(obj, torch.Tensor):
        if obj.requires_grad:
            out.append(obj)
    elif depth < 2 and isinstance(obj, (tuple, list)):
        for x in obj:
            _tensors(x, out, depth + 1)
    elif depth < 2 and isinstance(obj, dict):
        for x in obj.values():
            _tensors(x, out, depth + 1)
    return out


def attach_module_hooks(chosen, rec: Recorder, base: int = 0, param_ends=()) -> list:
    """Forward/backward hooks of every chosen module (see the module docstring), layer
    indices from `base`; returns the handles. param_ends: (param, layer index, or a callable
    giving it) for the end of a layer's backward when the parameter's gradient is
    accumulated (a callable for a parameter several layers hold: tied weights)."""
    handles = []
    grad_on = torch.is_grad_enabled
    compiling = torch.compiler.is_compiling
    # the layers whose backward's end an op in a compiled graph marks: their parameters'
    # gradients are accumulated once the whole compiled backward is done, no layer's end there
    # (a layer whose input needs no gradient, an embedding's, keeps its parameters' mark)
    in_graph: set[int] = set()
    for i, (_name, mod) in enumerate(chosen, base):
        def bwd_end(g, i=i):
            rec.bwd_end(i)

        def bwd_begin(g, i=i):
            rec.bwd_begin(i)

        # traced by torch.compile: the same marks as ops in the graph (ranks.core.markop), no
        # graph break; the start's gradient is the backward's end, the end's its start
        def op_bwd_end(_g, i=i):
            in_graph.add(i)
            rec.bwd_end(i)
        pre_code = markop.register(lambda _x, i=i: rec.fwd_begin(i), op_bwd_end)
        post_code = markop.register(lambda _x, i=i: rec.fwd_end(i), lambda _g, i=i: rec.bwd_begin(i))

        def pre(m, args, i=i, bwd_end=bwd_end, code=pre_code):
            if compiling():
                return markop.marked(args, code)
            if rec.cur is None:
                return
            rec.fwd_begin(i)
            if grad_on():
                for x in _tensors(args, []):
                    x.register_hook(bwd_end)

        def post(m, args, out, i=i, bwd_begin=bwd_begin, code=post_code):
            if compiling():
                return markop.marked(out, code)
            if rec.cur is None:
                return
            rec.fwd_end(i)
            if grad_on():
                for x in _tensors(out, []):
                    x.register_hook(bwd_begin)

        # a ModuleList/ModuleDict is never called itself: its span is its children's
        for target in (list(mod.children()) or [mod]) if isinstance(mod, UNCALLED) else [mod]:
            handles.append(target.register_forward_pre_hook(pre))
            handles.append(target.register_forward_hook(post))
    for p, i in param_ends:
        if callable(i):
            def end(p, f=i):
                j = f()
                if j not in in_graph:
                    rec.bwd_end(j)
        else:
            def end(p, i=i):
                if i not in in_graph:
                    rec.bwd_end(i)
        handles.append(p.register_post_accumulate_grad_hook(end))
    return handles

