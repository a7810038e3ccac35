"""Turning a step's marks into spans, off the training thread: when each collective started
(`comm_starts`), and letting go of the GIL while resolving (`letting_go`) so that the training
thread's hooks are not kept waiting by the sender thread."""
from __future__ import annotations

import select
import time

from ranks.clock import now_ns


def comm_starts(ready: list[int], end: list[int], thr: list, serial: bool,
                free: list | None = None) -> list[int]:
    """When each collective (in issue order) started running.

    serial (one stream, NCCL): when it was ready and the previous one had ended.
    threads (gloo): when it was ready and the previous collective that ran on the same backend
    thread (the thread its completion callback ran on) had ended: gloo's worker threads take
    queued works first come, first served, and run them to completion.
    `free`: when the backend thread was done with each collective, where that differs from
    its drawn end (gloo with CUDA tensors: the thread is free once the copy back to the GPU
    is queued; the collective ends, drawn, when that copy lands)."""
    if serial:  # as if one thread ran them all
        thr = [None] * len(ready)
    if free is None:
        free = end
    out = []
    last: dict = {}
    for r, e, t, f in zip(ready, end, thr, free):
        out.append(min(max(r, last.get(t, 0)), e))
        last[t] = max(last.get(t, 0), f)
    return out


# The sender thread resolves a step while the training thread runs the next. Each CUDA mark
# releases the GIL (Event.record); a thread that wants it back waits until the holder lets go,
# which a pure-Python loop does only at the switch interval (5 ms): a hook would wait for the
# sender's whole stretch. Resolving, the sender lets go every YIELD_EVERY events (~20 µs)
# for a system call that returns at once: cheap, but a hand-over only when the waiting thread
# wakes before the sender takes the GIL again (measured: 44-90 of 1,500 let-gos, and now and
# then none in 57 ms). So at least every HANDOFF_NS it sleeps instead (time.sleep(0): the
# kernel runs the waiting thread, ~70 µs), which hands the GIL over: a hook waits at most
# about that long, for ~14 % more of the sender's own time (off the training thread).
YIELD_EVERY = 16
HANDOFF_NS = 500_000
_last_handoff = [0]


def letting_go(resolve, every: int):
    """`resolve` (a mark -> ns), letting go of the GIL every `every` calls (0: never): off the
    training thread, a hook waiting for the GIL gets it within a few marks, not a switch
    interval."""
    if not every:
        return resolve
    count = [0]

    def ns(tok):
        count[0] += 1
        if count[0] % every == 0:
            _let_go()
        return resolve(tok)
    return ns


def _let_go() -> None:
    t = now_ns()
    if t - _last_handoff[0] >= HANDOFF_NS:
        time.sleep(0)
        _last_handoff[0] = now_ns()
    else:
        select.select((), (), (), 0)
