"""What a live run watches for while torchrun runs: a rank process gone, a rank that reported
an error while torchrun keeps the others alive, no step finished for too long (a hung
collective), and ranks whose heartbeat stopped (a warning, and a note when it comes back)."""
from __future__ import annotations

import psutil

from ddptui.model import hang


class Watchdog:
    def __init__(self, store, hang_s: float, hb_timeout_s: float, on_rank_gone, now: float):
        self.store = store
        self.hang_s, self.hb_timeout_s = hang_s, hb_timeout_s
        self.on_rank_gone = on_rank_gone  # (rank) -> None: the process is gone, torchrun still runs
        self.last_progress = now
        self._last_spans = 0
        self._first_error: float | None = None
        self._warned: set = set()

    def progress(self, now: float) -> None:
        """Spans arrived since the last look: the run moves."""
        if self.store.spans != self._last_spans:
            self._last_spans = self.store.spans
            self.last_progress = now

    def check(self, now: float) -> str | None:
        """Look at the ranks; returns why the run must end (None: it goes on)."""
        st = self.store
        ranks = st.rank_snapshot()
        for r, info in ranks.items():
            if info.pid and not info.finished and info.exit is None and not psutil.pid_exists(info.pid):
                self.on_rank_gone(r)
        # a rank reported an error (e.g. a collective timed out): torchrun normally ends the
        # others at once; if it has not within a few seconds, end the run ourselves
        errors = [(r, i.error) for r, i in sorted(ranks.items()) if i.error]
        if errors:
            self._first_error = self._first_error or now
            if now - self._first_error > 3.0:
                return "; ".join(f"rank {r}: {e}" for r, e in errors)
        training = any(i.phase == "training" for i in ranks.values())
        stuck = None
        if training and now - self.last_progress >= hang.STALL_S:
            # which collective the ranks are inside, and who never entered it (their heartbeats)
            stuck = hang.stall(ranks, list(st.meta.layers))
            if stuck is not None:
                key = ("stall", stuck.op, stuck.seq, tuple(sorted(stuck.never)), tuple(sorted(stuck.past)))
                if key not in self._warned:
                    self._warned.add(key)
                    st.add_log(f"no progress for {now - self.last_progress:.0f} s: {stuck.text()}", "warn")
        if training and now - self.last_progress > self.hang_s:
            r, info = sorted(ranks.items(), key=lambda kv: kv[1].step)[0]
            if stuck is not None:
                return f"no step finished for {self.hang_s:.0f} s: {stuck.text()}"
            return (f"no step finished for {self.hang_s:.0f} s: rank {r} stuck after step {info.step} "
                    f"(hung collective?)")
        for r, info in ranks.items():
            if info.connected and info.last_seen and now - info.last_seen > self.hb_timeout_s:
                if ("hb", r) not in self._warned:
                    self._warned.add(("hb", r))
                    st.add_log(f"rank {r} not responding: no heartbeat for {now - info.last_seen:.0f} s", "warn")
            elif ("hb", r) in self._warned:
                self._warned.discard(("hb", r))
                st.add_log(f"rank {r} responding again", "info")
        return None
