"""What a live run watches for while torchrun runs: a rank process gone, a rank that reported
an error while torchrun keeps the others alive, no step finished for too long (a hung
collective), and ranks whose heartbeat stopped (a warning, and a note when it comes back)."""
from __future__ import annotations

import psutil

from ddptui.model import hang


class Watchdog:
    def __init__(self, store, hang_s: float, hb_timeout_s: float, on_rank_gone, now: float,
                 on_stall=None):
        self.store = store
        self.hang_s, self.hb_timeout_s = hang_s, hb_timeout_s
        self.on_rank_gone = on_rank_gone  # (rank) -> None: the process is gone, torchrun still runs
        self.on_stall = on_stall  # () -> None: a stall named (each new one), the ranks still there
        self.last_progress = now
        self._last_spans = 0
        self._first_error: float | None = None
        self._warned: set = set()
        self._stalled: str | None = None  # what the stall said while no step finishes, in short

    def progress(self, now: float) -> None:
        """Spans arrived since the last look: the run moves (after a stall said, said too)."""
        if self.store.spans != self._last_spans:
            self._last_spans = self.store.spans
            if self._stalled is not None:
                self.store.add_log(f"steps again after {now - self.last_progress:.0f} s without one "
                                   f"(the stall: {self._stalled})", "info")
                self._stalled = None
            self.last_progress = now

    def _typical_step_s(self) -> float:
        """The median step of the last 20 of each strategy, the longest of them (s); 0 while a
        strategy has not completed two steps (its first takes its start-up: DDP's wrap, FSDP2's
        sharding, seconds on a loaded machine, and the next strategy's first comes after the
        last one's)."""
        got = 0.0
        for strategy in self.store.strategies():
            ms = sorted(f.step_ms for f in self.store.recent_figures(strategy, n=20))
            if len(ms) < 2:
                return 0.0
            got = max(got, ms[len(ms) // 2] / 1e3)
        return got

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
            # which collective the ranks are inside, and who never entered it (their heartbeats;
            # DDP's bucket AllReduces too)
            stuck = st.stall()
            if stuck is not None:
                key = ("stall", stuck.op, stuck.seq, tuple(sorted(stuck.never)), tuple(sorted(stuck.past)))
                if key not in self._warned:
                    self._warned.add(key)
                    st.add_log(f"no progress for {now - self.last_progress:.0f} s: {stuck.text()}", "warn")
                    self._stalled = stuck.collective()
                    if self.on_stall is not None:
                        self.on_stall()
            elif self._stalled is None and (typical := self._typical_step_s()) > 0 and \
                    now - self.last_progress >= max(2 * hang.STALL_S, 10 * typical):
                # no rank inside a collective ddptui sees (or no heartbeat says so): said anyway,
                # once steps have been seen to take their time (not while the first ones start:
                # building, the first step's warm-up on a loaded machine)
                where = ", ".join(f"rank {r} step {i.step}" for r, i in sorted(ranks.items())
                                  if not i.finished and i.exit is None)
                st.add_log(f"no progress for {now - self.last_progress:.0f} s ({where}; no rank is inside "
                           "a collective ddptui sees)", "warn")
                self._stalled = "no collective named"
                if self.on_stall is not None:
                    self.on_stall()
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
