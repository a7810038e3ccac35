"""Multi-node runs: node 0's side (ddptui --nnodes N --node-rank 0 ... --listen A:P --token-file F).

Node 0 launches its local ranks under torchrun's c10d rendezvous and, with --listen, accepts
the other nodes' `ddptui join` (ddptui/live/netlisten.py); the join learns everything it needs
to start its own torchrun agent from `join_settings`.
"""
from __future__ import annotations

import secrets
import sys
from dataclasses import dataclass

MAX_NODES = 64


@dataclass
class MultiNode:
    nnodes: int
    node_rank: int
    nproc_per_node: int
    rdzv_endpoint: str
    listen: str | None = None  # ADDR:PORT (None: no listener; join impossible, plain torchrun only)
    token_file: str | None = None
    run_id: str = ""

    def __post_init__(self):
        if not self.run_id:
            self.run_id = secrets.token_hex(8)

    @property
    def world(self) -> int:
        return self.nnodes * self.nproc_per_node


def torchrun_cmd(nnodes: int, node_rank: int, nproc: int, endpoint: str, run_id: str, worker_args: list[str],
                 is_host: bool | None = None) -> list[str]:
    """torchrun for one node of a c10d rendezvous."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--node-rank", str(node_rank),
           "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
           "--rdzv-id", run_id]
    if is_host is not None:
        cmd += ["--rdzv-conf", f"is_host={int(is_host)}"]
    return [*cmd, "-m", "ranks.builtin.worker", *worker_args]


def join_settings(m: MultiNode, worker_args: list[str], device: str, threads: int) -> dict:
    """What a join needs to start its node's torchrun agent (sent after the handshake)."""
    return {"nnodes": m.nnodes, "nproc_per_node": m.nproc_per_node, "rdzv_endpoint": m.rdzv_endpoint,
            "rdzv_id": m.run_id, "worker_args": list(worker_args), "device": device, "threads": threads}


def start_listener(run, worker_args: list[str], env: dict):
    """Node 0: the TCP listener (only with --listen); None without."""
    m: MultiNode = run.multinode
    if m is None or not m.listen:
        return None
    from .netlisten import NetListener, parse_hostport, read_token_file
    host, port = parse_hostport(m.listen, "--listen")
    token = read_token_file(m.token_file)
    lst = NetListener(host, port, token, m.run_id, join_settings(m, worker_args, run.plan.device, run.opts.threads),
                      run.collector, run.feed, run.store)
    run.status(f"listening for other nodes on {lst.address[0]}:{lst.address[1]} "
               f"(ddptui join {m.listen} --token-file ...)")
    return lst
