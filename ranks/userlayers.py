"""Which modules of a user's model are its layers (`choose_layers`), and the module hooks that
time each chosen layer's forward and backward through a UserRecorder (ddptui.instrument)."""
from __future__ import annotations

import torch
import torch.nn as nn

from .instrument import Recorder

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


def auto_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """layers="auto": start from the model's children (containers opened); while fewer than
    AUTO_MIN_BLOCKS of them hold parameters, or those hold under half of the model's, open
    the one with children that holds the most parameters (a LightningModule -> its model ->
    its blocks; HF `transformer.h.N`, `model.layers.N`). A level that already has them is kept
    whole, even where one block holds most parameters."""
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


class UserRecorder(Recorder):
    """Recorder for modules that may run more than once a step: a layer's span goes from
    its first start to its last end (the workers' blocks run once)."""

    def fwd_begin(self, layer: int) -> None:
        c = self.cur
        if c is not None and c.fwd_s[layer] is None:
            c.fwd_s[layer] = self.clock.mark()

    def fwd_end(self, layer: int) -> None:
        c = self.cur
        if c is not None:
            self._mark_again(c.fwd_e, layer)

    def bwd_begin(self, layer: int) -> None:
        c = self.cur
        if c is not None and c.bwd_s[layer] is None:
            c.bwd_s[layer] = self.clock.mark()

    def opt_begin(self) -> None:
        if self.cur is not None:
            super().opt_begin()

    def opt_end(self) -> None:
        if self.cur is not None:
            super().opt_end()


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


def attach_module_hooks(chosen, rec: Recorder, param_layer: dict) -> list:
    """Forward/backward hooks of every chosen module (see the module docstring); returns the
    handles. param_layer: id(param) -> layer index, for the end of a layer's backward."""
    handles = []
    grad_on = torch.is_grad_enabled
    for i, (_name, mod) in enumerate(chosen):
        def bwd_end(g, i=i):
            rec.bwd_end(i)

        def bwd_begin(g, i=i):
            rec.bwd_begin(i)

        def pre(m, args, i=i, bwd_end=bwd_end):
            if rec.cur is None:
                return
            rec.fwd_begin(i)
            if grad_on():
                for x in _tensors(args, []):
                    x.register_hook(bwd_end)

        def post(m, args, out, i=i, bwd_begin=bwd_begin):
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
    for p, i in param_layer.values():
        handles.append(p.register_post_accumulate_grad_hook(lambda p, i=i: rec.bwd_end(i)))
    return handles


# -- where frames go -------------------------------------------------------------------------
