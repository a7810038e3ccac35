"""`ddptui run`'s entry point in each torchrun worker: runs the user's script as __main__.

    python -m torch.distributed.run ... -m ranks.scripts.userboot SCRIPT ARGS...

An exception that ends the script is sent to the app with this rank (an `error` frame,
through the script's ddptui.instrument handle, or a connection of its own when the script
never got that far), printed, and the process exits 1. With DDPTUI_AUTO=1 (`ddptui run
--auto`) every DistributedDataParallel the script builds is instrumented as it is
constructed (layers from DDPTUI_LAYERS, default auto; several DDP modules of a rank drawn
as one model, ranks.scripts.user.RankSession), an FSDP2 model at its first forward, and a
model no wrapper synchronises (data parallelism written by hand) at its optimizer's first
step; every torch optimizer's step is timed through torch's global optimizer hooks: no
change to the script.
"""
from __future__ import annotations

import os
import runpy
import sys
import traceback


def _auto() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    from ranks.scripts import user
    real_init = DDP.__init__
    spec = os.environ.get("DDPTUI_LAYERS", "auto")
    layers = int(spec) if spec.isdigit() else spec if spec == "auto" else spec.split(",")

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        user.instrument(self, layers=layers).by_auto = True  # (the script's own call: this handle)

    DDP.__init__ = init
    _auto_fsdp(layers)
    _auto_plain(layers)

    def begin():  # every DDP module of this rank is in one session: one step
        s = user._session
        if s is not None and not s.closed:
            s.opt_begin()

    def post(opt, args, kwargs):
        s = user._session
        if s is not None and not s.closed:
            s.after_opt(opt, args, kwargs)

    register_optimizer_step_pre_hook(user.opt_step_pre(begin))
    register_optimizer_step_post_hook(post)


def _auto_fsdp(layers) -> None:
    """An FSDP2 model (fully_shard) is instrumented at its first forward: the first FSDP2
    module called is the root (the outermost call comes first). A global forward pre-hook
    looks for it until a model of this rank is instrumented (DDP's at its construction),
    then removes itself; the root's first call is then timed as any other."""
    import torch.nn as nn
    try:
        from torch.distributed.fsdp import FSDPModule
    except Exception:  # noqa: BLE001 - a torch without FSDP2
        return
    from ranks.scripts import user
    handle = None

    def pre(module, args):
        s = user._session
        if s is not None and not s.closed:
            handle.remove()  # (a DDP model is drawn: it was instrumented when built)
            return None
        if isinstance(module, FSDPModule) and getattr(module, "_ddptui", None) is None:
            handle.remove()
            h = user.instrument(module, layers=layers)
            h.by_auto = True
            h._forward_pre(module, args)  # (its hook was made during this call: not called for it)
            if not user._batch_of(args, None) and h.session is not None:
                # (this call's keyword arguments, unseen here: its batch counted at its end)
                def late(m, a, kw, out):
                    once.remove()
                    h.session.step_batch += user._batch_of(a, kw) if h.session._order is None else 0
                once = module.register_forward_hook(late, with_kwargs=True)
        return None

    handle = nn.modules.module.register_module_forward_pre_hook(pre)


_not_drawn: list[str] = []  # why a model found by --auto could not be instrumented (said at the end)


def _auto_plain(layers) -> None:
    """A model no wrapper synchronises (the script reduces its gradients itself: the course's
    naive loop, its hook form, an engine of its own): the modules called with autograd on
    until the first optimizer step are noted (a global forward pre-hook, removed at that
    step); there, the outermost of them holding parameters that optimizer updates are
    instrumented (several: one picture), and the next forward starts the first step drawn.
    A DDP or FSDP2 model, instrumented by then, wins: nothing more is done, and the hook is
    gone at the first module called after it was (a compiled model is traced without it). A
    compiled model synchronised by hand is compiled once more after its first step (the hooks
    changed under its guards); no graph break."""
    import torch
    import torch.nn as nn
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from ranks.scripts import user
    called: dict[int, nn.Module] = {}
    state = {"done": False}

    def pre(module, args):
        if torch.compiler.is_compiling():  # (nothing traced into a compiled graph)
            return None
        if user._session is not None:  # a DDP or FSDP2 model is drawn: nothing to find; gone
            fwd.remove()  # before any compiled module is traced (no recompile of theirs)
            return None
        if torch.is_grad_enabled() and id(module) not in called:
            called[id(module)] = module
        return None

    fwd = nn.modules.module.register_module_forward_pre_hook(pre)

    def choose(opt, args, kwargs):  # (torch iterates its global hooks: this one stays, done)
        if state["done"]:
            return None
        state["done"] = True
        fwd.remove()
        mods = list(called.values())
        called.clear()
        if user._session is not None or user._handles:
            return None
        trained = {id(p) for g in opt.param_groups for p in g["params"]}
        inner = {id(sub) for m in mods for sub in m.modules() if sub is not m}
        roots = [m for m in mods if id(m) not in inner and any(id(p) in trained for p in m.parameters())]
        for m in roots:
            try:
                h = user.instrument(m, layers=layers)
            except (TypeError, ValueError, RuntimeError) as e:
                _not_drawn.append(f"{type(m).__name__} is not drawn: {e}")
                return None
            h.by_auto = True
        return None

    register_optimizer_step_pre_hook(choose)


def _report(exc: BaseException) -> None:
    from ranks.scripts import user
    if user._handles:
        user.report_error(exc)
        return
    sock = os.environ.get("DDPTUI_SOCKET")
    if not sock:
        return
    from ranks import frames
    from ranks.core.emitter import Emitter
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    try:
        em = Emitter(sock, os.environ.get("DDPTUI_TOKEN", ""), rank)
        em.send_now(frames.Hello(rank=rank, world=world, pid=os.getpid(), strategies=[user.STRATEGY]))
        em.send_now(frames.Error(rank=rank, msg=f"{type(exc).__name__}: {exc}".strip()[:500],
                                 tb=traceback.format_exc(limit=6)[-4000:]))
        em.close(timeout=2.0)
    except OSError:
        pass


def main() -> None:
    if len(sys.argv) < 2:
        print("ranks.scripts.userboot: no script given", file=sys.stderr)
        os._exit(2)
    script = os.path.abspath(sys.argv[1])
    sys.argv = [script, *sys.argv[2:]]
    sys.path[0] = os.path.dirname(script)
    if os.environ.get("DDPTUI_AUTO") == "1":
        _auto()
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            _report(RuntimeError(f"the script exited with status {e.code}"))
        raise
    except BaseException as e:  # noqa: BLE001 - reported with this rank, then exit 1
        _report(e)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    from ranks.scripts import user
    if os.environ.get("DDPTUI_AUTO") == "1" and not user._handles:
        why = (_not_drawn[0] if _not_drawn else
               "the script stepped no optimizer over a model it called (DDP, FSDP2 or any nn.Module "
               "trained by hand)")
        print(f"ddptui: {why}: nothing was timed", file=sys.stderr, flush=True)
    user._close_all()


if __name__ == "__main__":
    main()
