"""P3a's frames, one at a time when told (not a benchmark itself: `p3_drawing.py --vs` runs
it, once for each revision, and alternates their frames).

    python benchmarks/_paced.py ROOT RENDERS

runs ROOT's own P3a frame loop (ROOT/benchmarks/p3_drawing.py `frame_times`, that revision's
app and data) in this process. Before each frame it waits for a line on stdin; after each it
writes a line on stdout. At the end it writes `result <json>`: the CPU and wall times of every
frame, ms. The loop is paced where it reads its clock (`time.perf_counter`, at the start and
the end of every frame), so any revision's loop runs unchanged; nothing else of it is touched.
Nothing here imports ddptui: ROOT's code is the only ddptui in the process.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time


class _PacedClock:
    """`time` as the frame loop sees it: perf_counter waits for the go before a frame starts
    and says the frame is done after it ends (the CPU time is read between the two)."""

    def __init__(self, proto_in, proto_out):
        self._in, self._out, self._calls = proto_in, proto_out, 0

    def __getattr__(self, name):
        return getattr(time, name)

    def perf_counter(self) -> float:
        self._calls += 1
        if self._calls % 2:  # a frame starts: wait for its turn
            if not self._in.readline():
                sys.exit(0)  # (the parent went away)
            return time.perf_counter()
        now = time.perf_counter()
        self._out.write(".\n")
        self._out.flush()
        return now


def main() -> None:
    root, renders = os.path.abspath(sys.argv[1]), int(sys.argv[2])
    proto_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # (anything else written goes to stderr: stdout is the pacing's)
    sys.path[0] = os.path.join(root, "benchmarks")  # (this script's folder is another revision's)
    if root not in sys.path:
        sys.path.insert(1, root)
    os.chdir(root)
    import p3_drawing  # ROOT's

    p3_drawing.time = _PacedClock(sys.stdin, proto_out)
    cpu, wall = asyncio.run(p3_drawing.frame_times(renders))
    proto_out.write("result " + json.dumps({"cpu": cpu, "wall": wall}) + "\n")
    proto_out.flush()


if __name__ == "__main__":
    main()
