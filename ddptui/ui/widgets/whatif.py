"""What if: DDP's step at each cap of the bucket ladder, predicted from the last steps at the
cap in force (ddptui.model.whatif), next to the figures measured at each cap the run has tried.
Predictions are marked as such, with the fitted alpha, beta and the fit's error."""
from __future__ import annotations

import time

from ranks import spec

from ddptui.model import whatif
from ddptui.model.runinfo import flight_recorder_run
from ddptui.model.store import Store
from . import theme
from .panel import Frame, Panel
from .text import Parts

EVERY_S = 1.0  # predictions are recomputed at most this often (and when the step shown changes)
REPLAY_RANKS = 64  # beyond, the ranks replayed (whatif.replay_ranks): the panel's cost stays flat


def build(store: Store, got, cap_now: float | None) -> list[Parts]:
    if isinstance(got, str):
        return [[("what if: ", theme.style(theme.TEXT, bold=True)), (got, theme.style(theme.DIM))]]
    fit, basis, rows = got
    cap_txt = f"{basis.cap_mb:g} MB" + ("" if basis.explicit else " (default)")
    lines: list[Parts] = [
        [("what if", theme.style(theme.TEXT, bold=True)),
         (f" · PREDICTED from {len(basis.steps)} steps at {cap_txt}", theme.style(theme.WARN)),
         *([(f" · {len(basis.ranks)} of {basis.world:,} ranks replayed (the last ready, a spread)",
             theme.style(theme.DIM))] if basis.ranks is not None else []),
         (f" · α {fit.alpha_ms:.2f} ms β {fit.beta_ms_per_mb:.2f} ms/MB fit ±{fit.err_pct:.0f}%",
          theme.style(theme.DIM))],
        [(f"{'cap MB':>7}{'buckets':>8}{'pred step':>11}{'overlap':>9}{'meas step':>11}{'overlap':>9}",
          theme.style(theme.DIM, bold=True))]]
    for cap, p, m in rows:
        now = cap_now is not None and cap == cap_now
        ov = "–" if p.overlap_pct is None else f"{p.overlap_pct:.0f}%"
        ms = "–" if not m else f"{m['step_ms']:.1f}"
        mo = "–" if not m or m["overlap_pct"] is None else f"{m['overlap_pct']:.0f}%"
        lines.append([(f"{cap:>7g}", theme.style(theme.GOOD if now else theme.TEXT, bold=now)),
                      (f"{p.collectives:>8}{p.step_ms:>11.1f}{ov:>9}", theme.style(theme.WARN)),
                      (f"{ms:>11}{mo:>9}", theme.style(theme.TEXT)),
                      ("  ◀ in force" if now else "", theme.style(theme.GOOD))])
    return lines


def _applies(store: Store) -> bool:
    """DDP's bucket-cap ladder: a run with DDP's steps, not one read from a Flight Recorder (its
    dumps have no parameter table to bucket: the panel is not shown)."""
    return "ddp" in store.strategies() and not flight_recorder_run(store.meta)


class WhatIfPanel(Panel):
    MIN_WIDTH = 60

    def __init__(self, **kw):
        super().__init__(**kw)
        self._key = None
        self._at = 0.0
        self._got = None

    @staticmethod
    def rows_min(store: Store) -> int:
        return 0 if not _applies(store) else 3

    @staticmethod
    def rows_max(store: Store) -> int:
        return 0 if not _applies(store) else 2 + len(spec.BUCKET_LADDER_MB)

    def predictions(self, store: Store, upto: int | None, refresh: bool = True):
        """The ladder for the steps up to `upto`, recomputed at most every EVERY_S; with
        refresh False (live: the Updater's thread refreshes it) the last one, if any."""
        key = (upto, store.view_stamp("ddp"), len(store.cap_history()))
        now = time.monotonic()
        # its cost grows with ranks x steps replayed: with many ranks, fewer of the last steps
        # (at least 2), as many reference steps of ddp and of naive (every kept one up to 64
        # ranks), REPLAY_RANKS of the ranks replayed and a slower refresh (1,024 ranks: 2 and 2
        # steps, every 8 s; every kept step as reference took half the updater's time there,
        # and every rank replayed 0.7 s, a stall of every frame every 8 s)
        world = store.world or 2
        every, last = max(EVERY_S, world / 128), max(2, min(20, 2048 // world))
        ref_last = None if world <= 64 else last
        if self._got is None or (refresh and key != self._key and now - self._at >= every):
            try:
                self._got = whatif.ladder(store, upto=upto, last=last, reference_last=ref_last,
                                          max_ranks=REPLAY_RANKS)
            except (whatif.WhatIfError, ValueError, ZeroDivisionError) as e:
                waiting = isinstance(e, whatif.WhatIfError) and not isinstance(e, whatif.NotPredicted)
                self._got = f"waiting for steady ddp steps ({e})" if waiting else str(e)
            self._key, self._at = key, now
        return self._got

    def build_lines(self, frame: Frame) -> list[Parts]:
        store = frame.store
        upto = frame.shown.get("ddp")
        cap = store.cap_at(upto) if upto is not None else None
        return build(store, self.predictions(store, upto, refresh=not frame.prepared), cap)
