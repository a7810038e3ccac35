"""The Updater: one thread that keeps a Store's figures current while a run is live.

Frames come in on the collector's thread; the UI draws on its own at a fixed rate and only
reads. Between them this thread calls `Store.update()` (figures of complete steps, who
waited for whom, eviction) whenever something new came in, at most every `period` seconds,
so the work that grows with the ranks never runs on the thread that draws. `flush()` runs
one update now (a run that has ended: its last steps counted); `stop()` ends the thread.

`after`, when set (the UI sets it), is called on this thread after each update: the reader
makes there what its next frame needs that grows with the ranks (views, the per-layer
evidence, aggregated lanes), so the drawing thread finds it made. An exception in it is
logged once and `after` dropped (the reader then makes its own, as without an Updater).
"""
from __future__ import annotations

import threading

from .store import Store

PERIOD_S = 0.05  # at most 20 updates a second: steps arrive at most ~10 a second per strategy


class Updater:
    __slots__ = ("store", "period", "after", "_stop", "_thread", "_seen", "_asked", "error")

    def __init__(self, store: Store, period: float = PERIOD_S):
        self.store = store
        self.period = period
        self.after = None  # () -> None, run after each update (see the module's docstring)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen = -1
        self._asked = False  # request(): run `after` at the next beat even if nothing came in
        self.error: str | None = None  # the exception that ended the thread, in words

    def start(self) -> "Updater":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ddptui-updater", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.flush()
            except Exception as e:  # noqa: BLE001 - said on the status line; the UI stays up
                self.error = f"figures stopped: {type(e).__name__}: {e}"
                self.store.add_log(self.error, "error")
                return

    def request(self) -> None:
        """Run an update and `after` at the next beat even if no frame came in (the reader's
        own state moved on: e.g. following, a newer step is due)."""
        self._asked = True

    def flush(self) -> None:
        """One update now if anything came in since the last (or one was requested)."""
        v = self.store.version
        if v != self._seen or self._asked:
            self._seen = v  # a frame that comes in meanwhile is seen next time
            self._asked = False
            self.store.update()
            after = self.after
            if after is not None:
                try:
                    after()
                except Exception as e:  # noqa: BLE001 - the figures go on; the reader makes its own
                    self.after = None
                    self.store.add_log(f"preparing frames stopped: {type(e).__name__}: {e}", "warn")

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)
