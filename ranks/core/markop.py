"""Layer marks that torch.compile keeps in place: two custom ops, `ddptui::mark` (forward) and
`ddptui::bmark` (its gradient's), opaque to Dynamo and Inductor, that run a mark at run time.

A module hook that calls into ddptui's Python (a clock, the Recorder) is a graph break under
torch.compile: Dynamo cannot trace `time.monotonic_ns` or a CUDA event's record, so it cuts
the graph there (or gives the frame up and runs it eagerly): the user's program is no longer
the one that runs without ddptui. Traced, the hooks call `mark(x, code)` instead: an op whose
output the next layer consumes (a copy of `x`: an op may not return its input), so that no
pass deletes it as side-effect free or moves it off the layer boundary; its Python runs each
time the compiled graph runs, in order with the layers' own ops. Its autograd formula calls
`bmark(grad, code)`, which runs the backward's mark where the gradient passes the same
boundary (in the compiled backward graph too). `code` names a registered pair of callables
(`register`): the forward's mark and the backward's.

Under CUDA graphs (`mode="reduce-overhead"`) the Python of a mark runs while the graph is
captured only, never when it is replayed, and a CUDA event recorded then would be part of the
graph: a mark whose stream is capturing is skipped and counted (`captured`), and ddptui says
how many (the summary, its JSON); the layers inside the graph have no spans in its replays."""
from __future__ import annotations

import torch

from ranks import seams

_TABLE: list = []  # code -> (forward mark, backward mark): callables of the tensor passing
captured = [0]  # marks skipped: their op ran while its stream was capturing a CUDA graph
_CAPTURE_STANDIN = seams.graph_capture()  # (the test seam: every stream capturing, this rank's)


def register(fwd, bwd) -> int:
    """A pair of marks (either None; each called with the tensor the op passes: the forward's
    input or output, or its gradient) for the ops to run: returns its code."""
    _TABLE.append((fwd, bwd))
    return len(_TABLE) - 1


def _capturing(x) -> bool:
    if x.is_cuda:
        return torch.cuda.is_current_stream_capturing()
    return _CAPTURE_STANDIN


def _run(code: int, which: int, x) -> None:
    if _capturing(x):  # (in a CUDA graph's capture: never replayed, and no event of ours in it)
        captured[0] += 1
        return
    try:
        f = _TABLE[code][which]
    except IndexError:
        return
    if f is not None:
        f(x)


@torch.library.custom_op("ddptui::mark", mutates_args=())
def mark(x: torch.Tensor, code: int) -> torch.Tensor:
    """The forward's mark `code` (a layer boundary); returns a copy of x for the layer after it."""
    _run(code, 0, x)
    return x.clone()


@mark.register_fake
def _mark_fake(x, code):
    return torch.empty_like(x)


@torch.library.custom_op("ddptui::bmark", mutates_args=())
def bmark(g: torch.Tensor, code: int) -> torch.Tensor:
    """The backward's mark `code`: the gradient passing the boundary `mark` marked forward."""
    _run(code, 1, g)
    return g.clone()


@bmark.register_fake
def _bmark_fake(g, code):
    return torch.empty_like(g)


def _setup(ctx, inputs, output) -> None:
    ctx.code = inputs[1]


def _backward(ctx, grad):
    return torch.ops.ddptui.bmark(grad, ctx.code), None


mark.register_autograd(_backward, setup_context=_setup)


def marked(obj, code: int):
    """`obj` (a module's input args or output) with its first tensor passed through `mark`: a
    tensor, or a tuple or list holding one (the others as they are); None where there is no
    tensor to mark (a hook then changes nothing)."""
    if isinstance(obj, torch.Tensor):
        return torch.ops.ddptui.mark(obj, code)
    if isinstance(obj, (tuple, list)):
        for j, x in enumerate(obj):
            if isinstance(x, torch.Tensor):
                out = list(obj)
                out[j] = torch.ops.ddptui.mark(x, code)
                return tuple(out) if isinstance(obj, tuple) else out
    return None


__all__ = ["register", "marked", "mark", "bmark"]
