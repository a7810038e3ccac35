"""(tests) A gloo job that hangs, and each rank's Flight Recorder dumped as the NCCL watchdog
dumps it on a timeout (TORCH_NCCL_DUMP_ON_TIMEOUT: every rank, pickle, to
``<dir>/<case>/nccl_trace_rank_<rank>``). Nothing of ddptui: plain torch.distributed, its
collectives with a short timeout, so that the rank waiting raises (gloo) and dumps; a rank
that is stuck sleeps past the timeout, then dumps as the watchdog would have made it.

    --case pair (2 ranks): a warm-up on the default group; then on a subgroup of both ranks
        rank 1 never arrives at the 4th all_reduce, which rank 0 issued (``never/``, dumped at
        once: rank 0's in flight; its JSON form in ``never-json/``); then, while rank 0 waits
        in it, on the default group rank 1 issues an extra broadcast where rank 0 issues an
        all_reduce, and both time out (``extra/``: both groups' states, as a job's dump holds
        every group's; the subgroup's all_reduce ended by its timeout).
    --case trio (3 ranks; run it with a small TORCH_FR_BUFFER_SIZE: the buffers wrap): 20
        all_reduces of the default group, then on the subgroup [1, 2] rank 2 never arrives at
        the 3rd all_reduce while rank 0 stays healthy (``subgroup/``).
    --case pipe (2 ranks, a pipeline: stage 0 sends activations to stage 1, which sends their
        gradients back): a healthy step, 3 micro-batches and the step's all_reduce
        (``pipe-ok/``); then rank 0 is stuck before its next send (it never sends) while rank 1
        waits in its recv (``nosend/``).
    --case chain (3 ranks, stages 0 -> 1 -> 2): a healthy step (2 micro-batches, the step's
        all_reduce); then rank 0 skips its send and goes on to the step's all_reduce, rank 1
        waits in its recv from 0, rank 2 in its recv from 1 (``chain/``).

gloo records no send or recv in its Flight Recorder (torch 2.13: point-to-point ops never
reach its `enqueue`, where it records; they still count in its op_id and sequence number), so
the pipelines log each of theirs beside the dump, as NCCL would have recorded it, to
``<case>-p2p/rank<rank>.json``: kind, peer, shape, when issued, when it ended (none: in
flight at the dump). tests/test_frdump.py writes them into the dumps as NCCL entries.
"""
import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--case", choices=("pair", "trio", "pipe", "chain"), required=True)
p.add_argument("--out", required=True)
p.add_argument("--timeout", type=float, default=2.0)
a = p.parse_args()
TIMEOUT = datetime.timedelta(seconds=a.timeout)
if a.case in ("pair", "trio"):
    dist.init_process_group("gloo", timeout=TIMEOUT)
else:  # (connecting 5 ranks at once on loaded cores can take more than the hang's timeout)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))._set_default_timeout(TIMEOUT)
rank = dist.get_rank()
c10d = torch._C._distributed_c10d


P2P: list[dict] = []  # this rank's sends and recvs (the module docstring)


def dump(case: str, json_too: bool = False) -> None:
    """This rank's Flight Recorder, as the watchdog writes it (collectives, stack traces, every entry)."""
    d = os.path.join(a.out, case)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"nccl_trace_rank_{rank}"), "wb") as f:
        f.write(c10d._dump_fr_trace(True, False, False))
    if P2P:
        d = os.path.join(a.out, case + "-p2p")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"rank{rank}.json"), "w") as f:
            json.dump(P2P, f)
    if json_too:
        d = os.path.join(a.out, case + "-json")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"nccl_trace_rank_{rank}.json"), "wb") as f:
            f.write(c10d._dump_fr_trace_json(True, False))


def hang(fn) -> None:
    """fn's collective times out here (gloo raises after the group's timeout)."""
    try:
        fn()
    except RuntimeError as e:
        print(f"rank {rank}: {str(e).splitlines()[0][-80:]}", file=sys.stderr, flush=True)
    else:
        raise SystemExit(f"rank {rank}: the collective did not time out")


def stuck() -> None:
    time.sleep(a.timeout + 0.3)


def p2p(kind: str, t: torch.Tensor, peer: int, wait: bool = True):
    """isend or irecv on the default group, logged (the module docstring); waited for unless
    `wait` is False (then its work is returned)."""
    rec = {"kind": kind, "peer": peer, "group": "0", "shape": list(t.shape), "dtype": "Float",
           "created_ns": time.time_ns(), "ended_ns": None}
    P2P.append(rec)
    w = (dist.isend if kind == "send" else dist.irecv)(t, peer)
    if not wait:
        return w
    w.wait()
    rec["ended_ns"] = time.time_ns()
    return None


if a.case == "pair":
    for i in range(4):
        dist.all_reduce(torch.ones(100 + i))
    dist.all_gather_into_tensor(torch.empty(20), torch.ones(10))
    sub = dist.new_group([0, 1], timeout=TIMEOUT)
    for i in range(3):
        dist.all_reduce(torch.ones(64), group=sub)
    # rank 1 never arrives at the subgroup's 4th all_reduce
    waiting = dist.all_reduce(torch.ones(64), group=sub, async_op=True) if rank == 0 else None
    time.sleep(0.2)  # (gloo retires a finished collective just after its call returned)
    dump("never", json_too=True)
    if rank == 1:  # an extra collective: a broadcast where rank 0 all_reduces
        hang(lambda: dist.broadcast(torch.ones(7), src=0))
    else:
        hang(lambda: dist.all_reduce(torch.ones(7)))
        hang(waiting.wait)
    time.sleep(0.2)  # (the same for one that timed out)
    dump("extra")
elif a.case == "pipe":
    peer = 1 - rank
    for i in range(2):
        dist.all_reduce(torch.ones(8))
    for i in range(3):  # stage 0: forward, its gradient back; stage 1: the other way round
        if rank == 0:
            p2p("send", torch.full((4, 16), float(i)), peer)
            p2p("recv", torch.empty(4, 16), peer)
        else:
            p2p("recv", torch.empty(4, 16), peer)
            p2p("send", torch.ones(4, 16), peer)
    dist.all_reduce(torch.ones(8))
    time.sleep(0.2)
    dump("pipe-ok")
    if rank == 0:
        stuck()  # (its data loader never returns: it never sends the next micro-batch)
        dump("nosend")
    else:
        waiting = p2p("recv", torch.empty(4, 16), peer, wait=False)
        time.sleep(0.3)
        dump("nosend")
        hang(waiting.wait)
elif a.case == "chain":
    dist.all_reduce(torch.ones(8))
    for i in range(2):
        x = torch.full((2, 8), float(i))
        if rank > 0:
            p2p("recv", x, rank - 1)
        if rank < 2:
            p2p("send", x, rank + 1)
    dist.all_reduce(torch.ones(8))
    # the next step: rank 0 skips its send, straight to the step's all_reduce
    if rank == 0:
        waiting = dist.all_reduce(torch.ones(8), async_op=True)
    else:
        waiting = p2p("recv", torch.empty(2, 8), rank - 1, wait=False)
    time.sleep(0.3)
    dump("chain")
    hang(waiting.wait)
else:
    for i in range(20):
        dist.all_reduce(torch.ones(32))
    sub = dist.new_group([1, 2], timeout=TIMEOUT)
    if rank == 0:
        stuck()  # healthy: its default group's collectives all done
    else:
        for i in range(2):
            dist.all_reduce(torch.ones(16), group=sub)
        if rank == 2:
            stuck()  # never arrives at the subgroup's 3rd all_reduce
        else:
            hang(lambda: dist.all_reduce(torch.ones(16), group=sub))
    dump("subgroup")
sys.stdout.flush()
os._exit(0)  # (a hung job's groups cannot be destroyed cleanly)
