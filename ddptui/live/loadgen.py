"""A load generator without torch: N simulated ranks, one connection each to a run's Unix
socket, sending a synthetic run's frames at a steady pace (steps per second).

    python -m ddptui.live.loadgen --socket PATH --ranks 1024 --rate 10 --seconds 10 --model medium

The token comes from the environment (DDPTUI_TOKEN), as the real ranks get it. Frames are
built once (ddptui.recording.synthetic's ranks.frames Structs, a few different steps taken in
turn) and only their step and start time change per send. Each rank authenticates, says
hello (world = --ranks), then sends its spans for every strategy each step, a heartbeat a
second, and bye. Sends block when the app reads too slowly: no frame is ever dropped here,
the pace falls behind instead, and the last line says by how much:

    loadgen: sent 20480 spans frames (1024 ranks x 10 steps x 2 strategies, 552960 spans) in 1.02 s, behind 0.02 s
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import time

from ranks import frames, spec, wire

from ddptui.recording.synthetic import SyntheticRun

TEMPLATES = 4  # distinct synthetic steps taken in turn


class LoadGen:
    def __init__(self, path: str, token: str, ranks: int, model: str = "medium",
                 strategies=("naive", "ddp"), slow: tuple[int, int, float] | None = None, seed: int = 0):
        self.path, self.token, self.n = path, token, ranks
        self.run = SyntheticRun(model, ranks, strategies, seed=seed, slow=slow, late=(0.5, 10.0, 90.0))
        self.strategies = list(strategies)
        self.head = self.run.header_frames()
        first = [self.run.step_frames(k) for k in range(TEMPLATES)]
        self.buckets = [f for f in first[0] if type(f) is frames.Buckets]
        # template step -> [(rank, frame)] in send order (strategy by strategy, as ranks do)
        self.templates = [[(f.rank, f) for f in fs if type(f) is frames.Spans] for fs in first]
        self.socks: list[socket.socket] = []
        self.sent = 0  # spans frames
        self.spans = 0  # spans in them
        self._per_step = [sum(len(f.kind) for _, f in t) for t in self.templates]

    def connect(self) -> None:
        for r in range(self.n):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(self.path)
            s.sendall(wire.pack(frames.Auth(token=self.token, rank=r, version=wire.PROTOCOL_VERSION,
                                            pid=os.getpid())))
            self.socks.append(s)
        for r, s in enumerate(self.socks):
            s.sendall(wire.pack(self.head[r]))
        for f in self.buckets:
            self.socks[f.rank].sendall(wire.pack(f))

    def step(self, k: int) -> None:
        """Every rank's spans of step k (all strategies), stamped now."""
        base = time.monotonic_ns()
        socks = self.socks
        for r, f in self.templates[k % TEMPLATES]:
            f.step, f.base_ns = k, base  # the templates are ours: re-stamped in place
            socks[r].sendall(wire.pack(f))
        self.sent += len(self.templates[0])
        self.spans += self._per_step[k % TEMPLATES]

    def heartbeat(self, k: int) -> None:
        for r, s in enumerate(self.socks):
            s.sendall(wire.pack(frames.Hb(rank=r, step=k, phase="training", dropped=0)))

    def close(self) -> None:
        for r, s in enumerate(self.socks):
            try:
                s.sendall(wire.pack(frames.Bye(rank=r, dropped=0)))
            except OSError:
                pass
            s.close()

    def drive(self, rate: float, steps: int) -> float:
        """`steps` steps at `rate` a second; returns how far behind the pace it ended (s)."""
        t0 = time.monotonic()
        last_hb = t0
        for k in range(steps):
            due = t0 + k / rate
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            self.step(k)
            if time.monotonic() - last_hb >= 1.0:
                self.heartbeat(k)
                last_hb = time.monotonic()
        return max(0.0, time.monotonic() - (t0 + steps / rate))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddptui.live.loadgen",
                                description="simulated ranks over a run's Unix socket (no torch); "
                                            "the token comes from DDPTUI_TOKEN")
    p.add_argument("--socket", required=True, help="the run's Unix socket")
    p.add_argument("--ranks", type=int, default=256, help="simulated ranks (default 256)")
    p.add_argument("--rate", type=float, default=10.0, help="steps per second (default 10)")
    p.add_argument("--seconds", type=float, default=10.0, help="how long (default 10)")
    p.add_argument("--model", default="medium", choices=spec.MODELS, help="model (default medium)")
    p.add_argument("--strategies", default="naive,ddp", help="comma-separated (default naive,ddp)")
    p.add_argument("--slow", default=None, metavar="R:MS:LAYER", help="a slow rank, e.g. 700:40:fc2")
    a = p.parse_args(argv)
    token = os.environ.get("DDPTUI_TOKEN")
    if not token:
        print("loadgen: DDPTUI_TOKEN is not set (the run's token)", file=sys.stderr)
        return 2
    if not 2 <= a.ranks <= 4096 or not 0 < a.rate <= 1000 or not 0 < a.seconds <= 3600:
        print("loadgen: --ranks 2..4096, --rate 0..1000, --seconds 0..3600", file=sys.stderr)
        return 2
    strategies = [s for s in a.strategies.split(",") if s]
    if not strategies or any(s not in spec.STRATEGIES for s in strategies):
        print(f"loadgen: --strategies from {', '.join(spec.STRATEGIES)}", file=sys.stderr)
        return 2
    slow = None
    if a.slow:
        try:
            r, ms, layer = spec.parse_slow_rank(a.slow, a.model, a.ranks)
        except ValueError as e:
            print(f"loadgen: --slow {a.slow}: {e}", file=sys.stderr)
            return 2
        slow = (r, layer, ms)
    g = LoadGen(a.socket, token, a.ranks, a.model, strategies, slow)
    steps = max(1, round(a.rate * a.seconds))
    try:
        g.connect()
        t = time.monotonic()
        behind = g.drive(a.rate, steps)
        took = time.monotonic() - t
    except OSError as e:
        print(f"loadgen: {a.socket}: {e.strerror or e}", file=sys.stderr)
        return 1
    finally:
        g.close()
    print(f"loadgen: sent {g.sent} spans frames ({a.ranks} ranks x {steps} steps x {len(strategies)} strategies, "
          f"{g.spans} spans) in {took:.2f} s, behind {behind:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
