"""The one live-run loop of the verbs without a UI (`--headless`, `run --headless`, `bench`):
start the run, poll it with progress until it ends; on Ctrl-C (or any error) stop every rank
first, then let the exception go on to the caller, which reports what was measured."""
from __future__ import annotations

import signal
import time


def watch(run, prog, steps: int, say, what: str = "ranks", final_count: bool = False) -> None:
    """Run `run` (a LiveRun) to its end, `prog.update(steps)` between polls. `final_count`:
    print the last step count even if the previous one is recent. While the ranks are being
    stopped after an exception, a second Ctrl-C or a SIGTERM is ignored (no rank is left behind)."""
    try:
        run.start()
        while not run.poll():
            prog.update(steps)
            time.sleep(0.1)
        if final_count:
            prog.last_steps = 0.0
        prog.update(steps)
    except BaseException as e:
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        old_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            interrupted = isinstance(e, KeyboardInterrupt)
            if interrupted:
                say(f"interrupted: stopping {what}…")
            run.stop("interrupted" if interrupted else f"{type(e).__name__}: {e}")
            prog.update(steps)
            if interrupted:
                say("stopped; every rank has exited")
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)
        raise
