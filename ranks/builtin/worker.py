"""Entry point of each torchrun worker: ``python -m torch.distributed.run ... -m ranks.builtin.worker``.

Every selected strategy owns a replica of the same initial model. Strategies alternate step
by step inside the same processes, so they are compared under identical conditions. All ranks
agree on control state (stop, bucket size, straggler, the period of layer marks) with one small
all_reduce on a CPU gloo group, outside any measured span: before an iteration's first strategy
step, every `interval` iterations as agreed (`control_interval`: short steps do not pay it
every step), and after a strategy that ran on some ranks only (it lines the ranks up again).
"""
from __future__ import annotations

import argparse
import itertools
import os
import socket
import sys
import threading
import time
import traceback
from collections import deque
from datetime import timedelta

from ranks import frames, seams, spec
from ranks.core.emitter import Emitter

SEQ_SHIFT = 1 << 24  # control word = seq * SEQ_SHIFT + bucket_cap_kb
# straggler word = ((seq * 256 + rank) * 256 + layer) * SEQ_SHIFT + delay in ms


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="ranks.builtin.worker")
    p.add_argument("--model", default="small", choices=spec.MODELS)
    p.add_argument("--strategies", default=",".join(spec.DEFAULT_STRATEGIES))
    p.add_argument("--steps", type=int, default=0, help="steps per strategy; 0 = until stopped")
    p.add_argument("--batch-size", type=int, default=1024, help="global batch, split across ranks")
    p.add_argument("--bucket-cap-mb", type=float, default=None)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--pg-timeout", type=float, default=60.0)
    p.add_argument("--slow-rank", default=None, metavar="R:MS[:LAYER]",
                   help="delay rank R's backward of LAYER by MS ms every step")
    p.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--compile", default=None, metavar="BACKEND",
                   help="each block compiled with torch.compile(backend=BACKEND) (inductor, aot_eager)")
    p.add_argument("--layer-every", default="auto", metavar="N|auto",
                   choices=spec.LAYER_EVERY,
                   help="mark each layer on one step in N (auto: as few steps as keep ddptui's host "
                        "time within 1%% of a step, on the device's step where that is longer)")
    p.add_argument("--microbatches", type=int, default=spec.DEFAULT_MICROBATCHES,
                   help="the pipelines' (gpipe, 1f1b) microbatches a step")
    p.add_argument("--queue-size", type=int, default=256, help="frames queued for the app before dropping")
    p.add_argument("--save-weights", default=None, help="(tests) save final weights here")
    # --- ddptui verify (ranks/builtin/profwin.py) ---
    p.add_argument("--profile-steps", default=None, metavar="A:B",
                   help="(verify) run torch.profiler over loop iterations A..B-1")
    p.add_argument("--profile-dir", default=None, help="(verify) where each rank writes its profile")
    return p.parse_args(argv)


class Control:
    """Control messages from the app, applied by all ranks at the same step."""

    def __init__(self):
        self.lock = threading.Lock()
        self.stop = False
        self.word = 0  # latest seq * SEQ_SHIFT + cap_kb asked of this rank
        self.slow_word = 0  # latest straggler word asked of this rank

    def on_message(self, msg: frames.Frame) -> None:
        """A control frame already decoded and checked by ranks.frames (Stop, Set)."""
        t = type(msg)
        with self.lock:
            if t is frames.Stop:
                self.stop = True
            elif t is frames.Set and msg.key == "bucket_cap_mb":
                kb = int(round(msg.value * 1024))
                if 0 < kb < SEQ_SHIFT:
                    self.word = max(self.word, msg.seq * SEQ_SHIFT + kb)
            elif t is frames.Set and msg.key == "slow_ms":
                ms, rank, layer, seq = int(round(msg.value)), msg.slow_rank, msg.layer, msg.seq
                if 0 <= ms < SEQ_SHIFT and 0 <= rank < 256 and 0 <= layer < 256 and 0 < seq < (1 << 22):
                    self.slow_word = max(self.slow_word, ((seq * 256 + rank) * 256 + layer) * SEQ_SHIFT + ms)


class SyncProbe:
    """(GPU pass) torch.cuda's sync debug mode on inside measured steps only: every host-device
    synchronize there is recorded with where it comes from; written at the end with the size
    of the CUDA event pool. Set DDPTUI_SYNC_DEBUG=DIR (ranks.seams.sync_debug)."""

    def __init__(self, out_dir: str):
        import warnings
        self.out_dir = out_dir
        self.found: dict[str, dict] = {}
        self.steps = 0
        self._warnings = warnings
        self._ctx = None

    def before(self) -> None:
        import torch
        self._ctx = self._warnings.catch_warnings(record=True)
        self._caught = self._ctx.__enter__()
        self._warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")

    def after(self, strategy: str, step: int) -> None:
        import torch
        torch.cuda.set_sync_debug_mode(0)
        self._ctx.__exit__(None, None, None)
        self.steps += 1
        for w in self._caught:
            key = f"{strategy} {w.filename}:{w.lineno} {str(w.message)[:160]}"
            got = self.found.setdefault(key, {"count": 0, "first_step": step})
            got["count"] += 1

    def write(self, rank: int, clock) -> None:
        import json
        os.makedirs(self.out_dir, exist_ok=True)
        with open(os.path.join(self.out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "measured_steps": self.steps, "syncs": self.found,
                       "events_allocated": getattr(clock, "allocated", None),
                       "events_pooled": len(getattr(clock, "pool", []))}, f, indent=1)


class LineUp:
    """GPUs lined up before a step's control word only where one may still be running a step
    the others did not take: after a strategy that runs on some ranks only (`single`, rank 0),
    whose work would otherwise make the others' next AllReduce wait, drawn as communication.
    After the others every rank's GPU ran the same step, ended by the same collectives: a
    synchronize there would only idle the GPU, so that every step started on an idle GPU
    (its STEP and first forward taking the launch ramp) and P1 would not measure the loop
    that runs. Outside every span. `sync`: torch.cuda.synchronize, or None on CPU."""

    def __init__(self, sync, device, world: int):
        self.sync, self.device, self.world = sync, device, world
        self.pending = False
        self.count = 0

    def before_control(self) -> None:
        if self.pending and self.sync is not None:
            self.sync(self.device)
            self.count += 1
        self.pending = False

    def after(self, strategy: str) -> None:
        """Called on every rank for every strategy step, taken here or not."""
        self.pending = spec.strategy_ranks(strategy, self.world) < self.world


def slow_from_word(word: int) -> tuple[int, int, int]:
    """straggler word -> (rank, layer, ms)."""
    rest, ms = divmod(word, SEQ_SHIFT)
    rest, layer = divmod(rest, 256)
    return rest % 256, layer, ms


def every_vote(rec, strategy: str, runs_here: bool, every_step: bool, step: int = 0) -> int:
    """This rank's say in the period of layer marks (the control collective keeps the largest
    say, the shortest period: every rank then marks the same steps): minus the period it
    wants, asked for where the period in force ends (`step` a multiple of it: every rank's
    at the same steps), else the period in force; every step while a delay is injected here
    (it runs in the layer hooks) or under verify (matched layer by layer); no say where the
    strategy does not run here (single on the other ranks: they never time its steps)."""
    if not runs_here:
        return -spec.MAX_LAYER_EVERY
    if every_step:
        return -1
    cur = rec.layer_every(strategy)
    return -(cur if step % cur else rec.wanted_every(strategy))


# how often the control collective runs: an iteration of every strategy's step at the least,
# and about CONTROL_GAP_S apart where iterations are shorter (up to MAX_CONTROL_INTERVAL
# iterations): on 8 GPUs an xlarge iteration of four ~1 ms steps paid a gloo all_reduce of
# 8 ranks (~0.1-0.2 ms) before each step, ~15 % of the run; a stop, a bucket-cap change or a
# straggler then takes effect up to CONTROL_GAP_S later
CONTROL_GAP_S = 0.02
MAX_CONTROL_INTERVAL = 16


def control_interval(iteration_s: float | None, cur: int = 1) -> int:
    """The iterations between two control collectives this rank would have (a power of two):
    1 until an iteration has been timed. `cur`, the interval in force, stays while it spaces
    them between half and twice CONTROL_GAP_S (no flapping at a boundary)."""
    if not iteration_s or iteration_s <= 0:
        return 1
    gap = seams.control_gap_s(CONTROL_GAP_S)
    if gap / 2 <= cur * iteration_s <= 2 * gap or (cur == MAX_CONTROL_INTERVAL and cur * iteration_s < gap):
        return cur
    k = 1
    while k * iteration_s < gap and k < MAX_CONTROL_INTERVAL:
        k *= 2
    return k


def agreed_every(vote: int, slow_word: int) -> int:
    """The period of layer marks every rank takes from the control collective's result: 1
    while the straggler word says a delay is on (switched on at this very step too, before a
    rank's own say could tell)."""
    if slow_word and slow_from_word(slow_word)[2] > 0:
        return 1
    return max(1, -vote)


def choose_device(args, world: int, local_rank: int):
    import torch
    if args.device != "cpu" and torch.cuda.is_available():
        n = torch.cuda.device_count()
        device = torch.device("cuda", local_rank % n)
        backend = args.backend
        if backend == "auto":
            backend = "nccl" if n >= world else "gloo"
        note = ""
        if backend == "gloo":
            note = f"gloo with CUDA tensors: {n} GPU(s) for {world} ranks"
        return device, backend, note
    if args.device == "cuda":
        raise RuntimeError("--device cuda but torch sees no CUDA device")
    return torch.device("cpu"), "gloo", "gloo on CPU (no CUDA)"


def device_uuid(device) -> str | None:
    """The GPU's UUID as NVML writes it ("GPU-..."): how the app finds this rank's GPU."""
    import torch
    if device.type != "cuda":
        return None
    try:
        u = str(torch.cuda.get_device_properties(device).uuid)
    except (AttributeError, RuntimeError):
        return None
    return u if u.startswith(("GPU-", "MIG-")) else f"GPU-{u}"


def device_name(device) -> str:
    import torch
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return "cpu"


def main(argv=None) -> None:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    sock_path = os.environ.get("DDPTUI_SOCKET")
    token = os.environ.get("DDPTUI_TOKEN", "")
    if not sock_path:
        print("ranks.builtin.worker: DDPTUI_SOCKET is not set (start workers through ddptui)", file=sys.stderr)
        os._exit(2)
    control = Control()
    em = Emitter(sock_path, token, rank, maxsize=args.queue_size, on_control=control.on_message)
    try:
        code = run(args, rank, world, local_rank, em, control)
    except BaseException as e:  # report, then leave without interpreter teardown
        tb = traceback.format_exc(limit=6)
        em.send_now(frames.Error(rank=rank, msg=f"{type(e).__name__}: {e}".strip()[:500],
                                 tb=tb[-4000:]))
        em.close(timeout=2.0)
        sys.stderr.write(tb)
        sys.stderr.flush()
        os._exit(1)
    em.close(timeout=3.0)
    os._exit(code)


def _pipe_info(names: list[str], rank: int, world: int, m: int):
    """The hello's description of the built-in pipelines (gpipe, 1f1b), if any run: the
    model's blocks in `world` stages, one a rank, `m` microbatches; both plan (p - 1) / (m + p - 1)."""
    pipes = [n for n in names if n in spec.BUILTIN_PIPELINES]
    if not pipes or world < 2:
        return frames.UNSET
    return frames.PipeInfo(schedule=pipes[0], stages=world, microbatches=m, rank_stages=[rank],
                           plan_idle=(world - 1) / (m + world - 1))


def run(args, rank, world, local_rank, em: Emitter, control: Control) -> int:
    import torch
    import torch.distributed as dist

    from ranks.core.clocks import CpuClock, CudaClock
    from ranks.core.recorder import Recorder
    from ranks.builtin.models import build_model, make_dataset
    from ranks.builtin.strategies import STRATEGY_CLASSES, DDPStrategy, FSDPStrategy, PipelineStrategy, Strategy

    names = spec.parse_strategies(args.strategies)
    if args.batch_size % world:
        raise ValueError(f"--batch-size {args.batch_size} is not divisible by {world} ranks")
    device, backend, note = choose_device(args, world, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    em.send_now(frames.Hello(
        rank=rank, world=world, local_rank=local_rank, pid=os.getpid(),
        host=socket.gethostname(), device=device_name(device), backend=backend,
        uuid=device_uuid(device) or frames.UNSET,  # CPU: none
        note=note, torch=str(torch.__version__), model=args.model,
        layers=spec.layer_names(args.model),
        params=spec.param_table(args.model),
        strategies=names, batch=args.batch_size, steps=args.steps,
        bucket_cap_mb=args.bucket_cap_mb, seed=args.seed, lr=args.lr,
        threads=torch.get_num_threads(),
        pipe=_pipe_info(names, rank, world, args.microbatches),
    ))
    em.phase = "rendezvous"
    em.send_now(frames.Phase(rank=rank, phase="rendezvous"))
    kw = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, timeout=timedelta(seconds=args.pg_timeout), **kw)
    ctl_group = dist.new_group(backend="gloo") if backend != "gloo" else None
    em.phase = "building"
    em.send_now(frames.Phase(rank=rank, phase="building"))

    base = build_model(args.model, seed=args.seed)
    n_layers = len(spec.MODEL_WIDTHS[args.model]) - 1
    # gloo with CUDA tensors completes collectives on its own threads: their ends are
    # host readings (see CudaClock)
    clock = CudaClock(device, comm_on_host=backend == "gloo") if device.type == "cuda" else CpuClock()
    rec = Recorder(clock, n_layers, every=None if args.layer_every == "auto" else int(args.layer_every))
    strategies = []
    Strategy.compile_backend = args.compile
    PipelineStrategy.microbatches = args.microbatches
    for n in names:
        cls = STRATEGY_CLASSES[n]
        if n == "ddp":
            strategies.append(cls(base, rec, device, args.lr, world, bucket_cap_mb=args.bucket_cap_mb))
        else:
            strategies.append(cls(base, rec, device, args.lr, world))
    del base
    n_batches = 4
    X, Y = make_dataset(args.batch_size * n_batches, seed=args.seed, device=device)
    local = args.batch_size // world
    if args.compile:  # every strategy's blocks compiled before the steps (not in the first:
        em.phase = "compiling"  # a minute of Inductor on a CPU is no hang), on a batch of the
        em.send_now(frames.Phase(rank=rank, phase="compiling"))  # steps' shape
        for strat in strategies:
            strat.warm_up(X[:local], Y[:local])

    # --- ddptui verify: profiler window and the span-shift test seam (off: nothing runs) ---
    pw = shift = None
    if args.profile_steps:
        from ranks.builtin.profwin import ProfileWindow, parse_window
        pw = ProfileWindow(parse_window(args.profile_steps), args.profile_dir or ".", rank,
                           device.type == "cuda")
    shift_spec = seams.verify_shift()
    if shift_spec:
        from ranks.builtin.profwin import ShiftLazy, parse_shift
        shift = parse_shift(shift_spec)

    def emit(items):
        # items resolve themselves on the sender thread (Recorder.poll(lazy=True));
        # a dropped one counts its spans there (its own n_spans)
        for item in items:
            em.put(ShiftLazy(item, shift) if shift else item)
    # --- end verify ---

    from ranks.builtin.strategies import Straggle
    if args.slow_rank:
        s_rank, s_ms, s_layer = spec.parse_slow_rank(args.slow_rank, args.model, world)
        if s_rank == rank:
            rec.straggle = Straggle(device, s_ms, s_layer)
    sync_dir = seams.sync_debug()
    probe = SyncProbe(sync_dir) if device.type == "cuda" and sync_dir else None
    # the control word: stop, bucket cap word, straggler word, minus the iterations to the next
    # control (the least any rank wants), and minus each strategy's period of layer marks
    ctl = torch.zeros(4 + len(strategies), dtype=torch.int64)
    every_in_force = [1] * len(strategies)
    next_ctl = 0  # the iteration of the next control collective (every rank's the same)
    recent_iters: deque = deque(maxlen=8)  # the last iterations' times here (the shortest: the
    # first ones take the strategies' start-up, DDP's wrap and bucket rebuild, FSDP2's sharding)
    said_interval = 1
    line_up = LineUp(torch.cuda.synchronize if device.type == "cuda" else None, device, world)
    applied_slow = 0
    applied_word = 0
    em.phase = "training"
    em.send_now(frames.Phase(rank=rank, phase="training"))

    def control_step(k: int, first: bool, next_ctl: int) -> tuple[bool, int]:
        """The control collective at iteration k: (stop?, the next control's iteration)."""
        nonlocal applied_word, applied_slow, said_interval
        with control.lock:
            ctl[0] = 1 if control.stop else 0
            ctl[1] = control.word
            ctl[2] = control.slow_word
        ctl[3] = -control_interval(min(recent_iters) if recent_iters else None, said_interval)
        # the period of layer marks of each strategy: the shortest any rank wants (every rank
        # marks the same steps); every step while a delay is injected (it runs in the layer
        # hooks) or under verify (its window matches layer by layer)
        straggling = rec.straggle is not None and rec.straggle.layer >= 0
        for j, s_ in enumerate(strategies):
            ctl[4 + j] = every_vote(rec, s_.name, s_.runs_on(rank), straggling or pw is not None, k)
        dist.all_reduce(ctl, op=dist.ReduceOp.MAX, group=ctl_group)
        got = ctl.tolist()  # (the agreed word, read once)
        if got[0]:
            return True, next_ctl
        word = got[1]
        if word > applied_word:
            applied_word = word
            cap = (word % SEQ_SHIFT) / 1024
            for s in strategies:
                if isinstance(s, DDPStrategy):
                    s.wrap(cap)
            em.send_now(frames.Event(rank=rank, step=k, what="bucket_cap_mb", value=cap))
        slow = got[2]
        if slow > applied_slow:  # every rank at this step: the straggler on or off
            applied_slow = slow
            s_rank, s_layer, s_ms = slow_from_word(slow)
            if s_rank == rank:
                rec.straggle = rec.straggle or Straggle(device)
                rec.straggle.set(s_ms, s_layer)
            elif rec.straggle is not None:
                rec.straggle.set(0, -1)
            em.send_now(frames.Event(rank=rank, step=k, what="slow_ms", value=s_ms,
                                     slow_rank=s_rank, layer=s_layer))
        for j in range(len(strategies)):
            every_in_force[j] = agreed_every(got[4 + j], applied_slow)
        if first:  # (the next at a multiple of the interval: every rank the same)
            interval = max(1, -got[3])
            next_ctl = (k // interval + 1) * interval
            if interval != said_interval:
                said_interval = interval  # (the interval in force, every rank's)
                if rank == 0:  # recorded: how often control ran (dropped, never waited for,
                    # when the app is behind: a stalled app must not slow the ranks)
                    em.put(frames.Event(rank=rank, step=k, what="control_interval", value=interval),
                           n_spans=0)
        return False, next_ctl

    steps = itertools.count() if args.steps <= 0 else range(args.steps)
    stopped = False
    said_timing = False
    for k in steps:
        if pw is not None:
            pw.iteration_start(k)
        t_iter = time.monotonic()
        for si, strat in enumerate(strategies):
            partial = line_up.pending  # (the last strategy step ran on some ranks only)
            line_up.before_control()
            # every rank decides alike: from the agreed interval, and from which ranks run which
            # strategy (spec.strategy_ranks): never one rank in the collective without the others
            if partial or (si == 0 and k >= next_ctl):
                stopped, next_ctl = control_step(k, si == 0, next_ctl)
                if stopped:
                    break
            line_up.after(strat.name)
            if not strat.runs_on(rank):
                continue
            s0 = (k % n_batches) * args.batch_size
            xb, yb = X[s0:s0 + args.batch_size], Y[s0:s0 + args.batch_size]
            if strat.communicates and not getattr(strat, "whole_batch", False):
                xb, yb = xb[rank * local:(rank + 1) * local], yb[rank * local:(rank + 1) * local]
            strat.prepare()
            clock.maybe_calibrate()  # GPU timer -> host clock, outside any measured span
            em.clock_residual_ns = clock.residual_ns
            em.clock_bound_ns = getattr(clock, "bound_ns", None)
            em.step = k
            if probe is not None:
                probe.before()
            rec.begin(strat.name, k, every=every_in_force[si])
            strat.step(xb, yb)
            rec.end()
            if probe is not None:
                probe.after(strat.name, k)
            colls = strat.take_colls() if isinstance(strat, (FSDPStrategy, PipelineStrategy)) else None
            if colls:  # the collectives its spans name, before them
                em.send_now(frames.Colls(rank=rank, strategy=strat.name, rows=colls))
            emit(rec.poll(lazy=True))
            if isinstance(strat, DDPStrategy):
                if not said_timing:  # how its buckets are timed (the summary says it)
                    said_timing = True
                    em.send_now(frames.Event(rank=rank, step=k, what="comm_timing",
                                             value=spec.COMM_TIMING[strat.timing]))
                change = strat.take_layout_change()
                if change is not None:
                    layout, reported = change
                    em.send_now(frames.Buckets(rank=rank, strategy=strat.name, step=k,
                                               cap_mb=strat.cap_mb, ddp_reported=reported,
                                               buckets=[(b, ps, nb) for b, ps, nb in layout]),
                                timeout=0.5)
        if pw is not None:
            pw.iteration_end(k, force=stopped)
        if stopped:
            break
        recent_iters.append(time.monotonic() - t_iter)  # (the next control's interval: this rank's say)
    emit(rec.poll(wait=True, lazy=True))
    if rec.fr is not None:  # the last steps' buckets read now, not at the next interval; after
        # every step is resolved (on the sender thread), how many NCCL's timing did not cover
        rec.fr.refresh(force=True)
        last_k = int(getattr(em, "step", 0) or 0)
        em.send_now(lambda: frames.Event(rank=rank, step=last_k, what="fr_untimed",
                                         value=min(rec.fr_untimed, 2**31)))
    if probe is not None:
        probe.write(rank, clock)
    if args.save_weights:
        torch.save({s.name: {k: v.detach().cpu() for k, v in s.module.state_dict().items()}
                    for s in strategies if s.runs_on(rank)}, f"{args.save_weights}.rank{rank}.pt")
    em.phase = "done"
    em.send_now(frames.Bye(rank=rank, why="stopped" if stopped else "done"))  # (counts: the sink's)
    dist.barrier(group=ctl_group)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    main()
