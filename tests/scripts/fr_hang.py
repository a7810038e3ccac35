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
"""
import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--case", choices=("pair", "trio"), required=True)
p.add_argument("--out", required=True)
p.add_argument("--timeout", type=float, default=2.0)
a = p.parse_args()
TIMEOUT = datetime.timedelta(seconds=a.timeout)
dist.init_process_group("gloo", timeout=TIMEOUT)
rank = dist.get_rank()
c10d = torch._C._distributed_c10d


def dump(case: str, json_too: bool = False) -> None:
    """This rank's Flight Recorder, as the watchdog writes it (collectives, stack traces, every entry)."""
    d = os.path.join(a.out, case)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"nccl_trace_rank_{rank}"), "wb") as f:
        f.write(c10d._dump_fr_trace(True, False, False))
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
