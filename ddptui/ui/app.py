"""The Textual UI: a timeline pane per strategy, figures, a GPU panel; live or replay.

Drawing follows the store at a fixed frame rate (a timer polls the source and redraws
only when the store or the UI state changed). Anything that can take long — starting
the ranks, stopping them, seeking in a large recording — runs in a worker thread.
"""
from __future__ import annotations

import os
import time

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid
from textual.widgets import Footer, Static

from ranks import spec

from .jobs import JobQueue
from .source import BucketControl, ProfileControl, Source, StragglerControl, Transport
from ddptui.model.store import Store
from ddptui.model import figures, frverdict
from ddptui.model.gpu import shared_gpu_note
from ddptui.model.runinfo import simulated_label
from ddptui.model.views import Lane
from .viewmodel import (PanelSpec, ViewModel, latest_steps, next_bucket_cap, plan_screen, straggler_ask,
                        straggler_where)
from .widgets import (
    GUTTER,
    BucketsPanel,
    FiguresPanel,
    GotoScreen,
    GpuPanel,
    Headline,
    HelpScreen,
    HistoryPanel,
    PaneState,
    PartsView,
    StartupScreen,
    TimelinePane,
    figures_panel,
    headline,
    screens,
)
from .widgets import theme
from ddptui.ui.widgets.panel import Frame, Panel
from .widgets import aggregate, statuslines, waits
from ddptui.ui.widgets.waits import WaitsPanel
from .widgets.output import OutputScreen
from ddptui.ui.widgets.hosts import HostsPanel
from ddptui.ui.widgets.whatif import WhatIfPanel

FPS = 15
# live, frames prepared by the Updater: a frame that shows no newer step (the step counter,
# GPU samples moved on) is drawn at most this often; a newer step, a key, a resize at once
MINOR_EVERY_S = 0.25
NOTE_S = 4.0  # a note on the status line (a key that could not do what it says) stays this long
SPEEDS = spec.SPEED_LADDER
# key pairs the footer shows as one (`←→ step`)
STEP, ZOOM = Binding.Group("step", compact=True), Binding.Group("zoom", compact=True)
BUCKET, SPEED = Binding.Group("bucket", compact=True), Binding.Group("speed", compact=True)
# the panels below the lanes, in order of priority: (id, class)
PANELS: tuple[tuple[str, type[Panel]], ...] = (
    ("figures", FiguresPanel), ("hosts", HostsPanel), ("gpu", GpuPanel), ("buckets", BucketsPanel),
    ("waits", WaitsPanel), ("history", HistoryPanel), ("whatif", WhatIfPanel))


class DdpApp(App):
    TITLE = "ddptui"
    ENABLE_COMMAND_PALETTE = False
    CSS = """
    #title, #headline, #legend, #status { height: 1; }
    #banner { height: auto; background: #7a0000; color: #ffffff; text-style: bold; padding: 0 1;
              display: none; }
    #panes { height: 1fr; grid-size: 1; grid-gutter: 0 2; grid-rows: 1fr; }
    #panels { height: 6; grid-size: 1; grid-rows: 1fr; }
    """
    # the footer shows them in this order, and a narrow one loses the last: the keys that
    # only some runs have (p, b B d, [ ] g) come right after q and ?, the screenshot last;
    # a pair is shown once (`←→ step`)
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),
        Binding("question_mark", "help", "help"),
        Binding("p", "profile", "profile"),
        Binding("b", "bucket(-1)", "bucket−", group=BUCKET),
        Binding("B", "bucket(1)", "bucket+", group=BUCKET),
        Binding("d", "straggler", "straggler"),
        Binding("left_square_bracket", "speed(-1)", "slower", group=SPEED),
        Binding("right_square_bracket", "speed(1)", "faster", group=SPEED),
        Binding("g", "goto", "go to"),
        Binding("space", "pause", "pause"),
        Binding("left", "step(-1)", "step", group=STEP),
        Binding("right", "step(1)", "step", group=STEP),
        Binding("plus,equals_sign", "zoom(1)", "zoom+", group=ZOOM),
        Binding("minus", "zoom(-1)", "zoom−", group=ZOOM),
        Binding("o", "output", "output"),
        Binding("s", "screenshot", "screenshot"),
        # where b, B, d do not apply (a script's run, an attach, a replay): hidden, and said why
        Binding("b,B", "not_here('bucket')", show=False),
        Binding("d", "not_here('straggler')", show=False),
    ]
    ALWAYS = ("quit", "help", "screenshot", "output")

    def __init__(self, source: Source, *, title: str | None = None, fps: float = FPS,
                 screenshot_dir: str = ".", record: str | None = None, profile_s: float = 2.0):
        super().__init__()
        self.source = source
        self.talk_title = title
        self.fps = fps
        self.screenshot_dir = screenshot_dir
        self.record = record  # live: where the run is recorded (shown in the status line)
        self.transport: Transport | None = source if isinstance(source, Transport) else None
        self.buckets: BucketControl | None = source if isinstance(source, BucketControl) else None
        self.straggler: StragglerControl | None = source if isinstance(source, StragglerControl) else None
        self.profiler: ProfileControl | None = source if isinstance(source, ProfileControl) else None
        self.profile_s = profile_s  # (an attached job: key p's window)
        self._profiling = False
        self.straggler_ms = 0.0  # what was last asked of the ranks (0: off)
        self.vm = ViewModel()
        self.panes: dict[str, TimelinePane] = {}
        self._views: dict[tuple, object] = {}
        self.asked_cap: float | None = None
        self.error: str | None = None
        self._started = False
        self._stopping = False
        self.jobs = JobQueue(self, self.redraw, "transport")  # seek, play, speed: off the event loop
        self._ui_gen = 0
        self._drawn: tuple | None = None
        self._names_of: tuple | None = None  # (the store's layer and parameter names the panes have)
        self._drawn_at = 0.0  # (monotonic) and the steps that frame showed (see MINOR_EVERY_S)
        self._drawn_shown: dict | None = None
        self._plan_key: tuple | None = None
        self._caps_seen = 0
        self._rec_error_said = False  # live: the recording's failure told (a notice, once)
        self._banner_text = ""
        self._banner_rows = 0
        self._ticks = 0
        self._t0 = time.monotonic()
        self._prepared = 0  # frames the Updater's thread has prepared (each one: a frame to draw)
        self._prepared_shown: dict | None = None  # ... and the steps it made it for
        self._prepared_at = 0.0  # (monotonic) when the last was made
        self._prepared_rows: tuple = (None, None)  # ((steps, prepared frame), the figures' rows)
        self._note: tuple[str, float] | None = None  # (a note for the status line, until when: monotonic)

    # -- composition -----------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield PartsView(id="title")
        yield Headline(id="headline")
        yield Static(id="banner")
        yield Grid(id="panes")
        yield PartsView(id="legend")
        with Grid(id="panels"):
            for name, cls in PANELS:
                yield cls(id=name)
        yield PartsView(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.main = m = self.screen
        m.styles.background, m.styles.color = theme.BG, theme.TEXT
        self.grid, self.panel_grid = m.query_one("#panes", Grid), m.query_one("#panels", Grid)
        self.panels: dict[str, Panel] = {name: m.query_one(f"#{name}", cls) for name, cls in PANELS}
        self.headline = m.query_one(Headline)
        self.title_line, self.legend = m.query_one("#title", PartsView), m.query_one("#legend", PartsView)
        self.status_line, self.banner = m.query_one("#status", PartsView), m.query_one("#banner", Static)
        self._caps_seen = len(self.source.store.cap_history())
        if self.transport is None and not self._has_step():
            self.push_screen(StartupScreen())
        updater = getattr(self.source, "updater", None)
        if updater is not None and self.transport is None:  # live: made ahead, off this thread
            updater.after = self._prepare
        self.run_worker(self._start_source, thread=True, name="start", exit_on_error=False)
        self.set_interval(1 / self.fps, self._tick)
        self._redraw()

    @property
    def replay(self) -> bool:
        return self.transport is not None

    @property
    def paused(self) -> bool:
        return self.vm.paused

    @property
    def pinned(self) -> int | None:
        return self.vm.pinned

    def _start_source(self) -> None:
        try:
            self.source.start()
        except Exception as e:  # noqa: BLE001 - shown to the user, the app stays usable
            self.error = f"could not start: {type(e).__name__}: {e}"
        self._started = True

    # -- the frame clock -------------------------------------------------------------------
    def _tick(self) -> None:
        if not self.is_running or not self.main.is_running:
            return  # shutting down
        self._ticks += 1
        src = self.source
        if self._started and not self._stopping and not self._busy and not self.error:  # (poll is cheap)
            try:
                src.poll()
            except Exception as e:  # noqa: BLE001
                self.error = f"{type(e).__name__}: {e}"
        if isinstance(self.screen, StartupScreen):
            self._draw_startup()
        elif isinstance(self.screen, OutputScreen):  # (the ranks' output: new lines at this rate)
            self.screen.refresh_from(src.store)
        if self._prepares() and self.transport is None and not self.vm.paused and \
                self.vm.shown_steps(src.store) != self._prepared_shown:
            src.updater.request()  # following: a newer step is due (no frame may come to say so)
        key = self._draw_key()
        if key != self._drawn and self._due(key):
            self._redraw()

    def _due(self, key: tuple) -> bool:
        """A changed frame is drawn now, unless live with prepared frames all it brings is
        store changes without a newer step, and the last frame is younger than MINOR_EVERY_S."""
        drawn = self._drawn
        if drawn is None or not self._prepares() or key[:1] + key[2:] != drawn[:1] + drawn[2:]:
            return True  # (key[1], the prepared frames' count, is all that moved otherwise)
        if self._prepared_shown != self._drawn_shown:
            return True
        return time.monotonic() - self._drawn_at >= MINOR_EVERY_S

    def _draw_key(self, sizes: dict | None = None) -> tuple:
        """Everything a frame depends on: unchanged key, nothing to draw. Live, with an
        Updater preparing frames, the store's changes count once their data is made."""
        src, store = self.source, self.source.store
        sizes = tuple((self._sizes() if sizes is None else sizes).values())
        if self._prepares():
            version = self._prepared
        else:  # (following takes up a newer step FOLLOW_EVERY_S after it came: the store may
            # not change again to say so)
            version = (store.version, tuple(self.shown_steps().items()))
        return id(store), version, self._ui_gen, src.state, self._busy, self.size, sizes, self._note_text()

    def _sizes(self) -> dict:
        """Every pane's and panel's size (Widget.size looks a widget up each time: taken once
        a frame)."""
        return {w: w.size for w in (*self.panes.values(), *self.panels.values())}

    def _prepares(self) -> bool:
        """Live with an Updater preparing frames (see _prepare)."""
        updater = getattr(self.source, "updater", None)
        return updater is not None and updater.after is not None and updater.running

    def _prepare(self) -> None:
        """On the Updater's thread, after each update: the views of the steps the next frame
        shows, who waited for whom with the per-layer evidence, each pane's aggregated lanes,
        the figures' rows and the what-if ladder (the work that grows with the ranks), made
        into the caches the drawing reads; then the frame may be drawn. Nothing here touches
        what Textual draws: only pure functions of the store and their caches."""
        store = self.source.store
        shown = self.vm.shown_steps(store)
        now = time.monotonic()
        if shown == self._prepared_shown and now - self._prepared_at < MINOR_EVERY_S:
            # no newer step: such a frame is drawn at most every MINOR_EVERY_S (_due), so one
            # made sooner is never drawn (at 1,024 ranks frames come all the time, and half
            # the updates made one for nothing). Asked again at the Updater's next beat, so
            # the last change is prepared even when no frame comes after it
            self.source.updater.request()
            return
        gen = self._prepared + 1  # (a frame per prepare: the store may not have changed)
        self._prepared_at = now
        if self.is_running and self.panes:
            hosts = store.hosts()
            waits.culprit_gist(store, shown)  # (every strategy's summary)
            for s, pane in list(self.panes.items()):
                view = self._view(store, s, shown.get(s))
                height = pane.size.height
                if aggregate.banded(view, height):  # (the culprit's lane: asked for only where bands are drawn)
                    aggregate.for_pane(view, height, hosts, waits.culprit_rank(store, shown, s))
            self._prepared_rows = ((tuple(shown.items()), gen), figures_panel.compare_rows(store, shown))
            if shown.get("ddp") is not None:
                store.bucket_figures("ddp", shown["ddp"])  # (the buckets panel's)
            whatif_panel = self.panels.get("whatif")
            if whatif_panel is not None and whatif_panel.display:  # (recomputed at most once a second)
                whatif_panel.predictions(store, shown.get("ddp"), refresh=True)
        self._prepared_shown, self._prepared = shown, gen

    def _has_step(self) -> bool:
        store = self.source.store
        return bool(latest_steps(store))

    def _draw_startup(self) -> None:
        src = self.source
        if self._has_step():
            self.pop_screen()
            return
        failed = src.state == "failed" or self.error is not None
        lines = screens.startup_lines(src.store, "failed" if failed else src.state,
                                      self.error or src.message, None,
                                      time.monotonic() - self._t0, self._ticks, self.size.width)
        self.screen.show(lines)

    # -- drawing -----------------------------------------------------------------------------
    def _redraw(self) -> None:
        store = self.source.store
        sizes = self._sizes()
        self._drawn = self._draw_key(sizes)
        self._drawn_at, self._drawn_shown = time.monotonic(), self._prepared_shown
        strategies = store.strategies()
        if self._sync_panes(store, strategies):
            sizes = self._sizes()  # (again, with the pane just mounted)
        self._draw_banner()
        self._sync_plan(store, strategies)  # (its new sizes come at Textual's next layout)
        shown = self.shown_steps()
        views = {s: self._view(store, s, k) for s, k in shown.items()}
        mpc = self._ms_per_cell(views, sizes)
        cap_since = store.cap_changed_at(shown.get("ddp") or 0)
        hosts = store.hosts()
        nodes = tuple((r, n) for n, rs in sorted(hosts.items()) for r in rs) if len(hosts) > 1 else None
        pipe = store.meta.pipeline
        plan = pipe.get("plan_idle") if pipe else None
        plan_pct = 100.0 * sum(plan.values()) / len(plan) if plan else None
        for s, pane in self.panes.items():
            ddp = s == "ddp"
            view, height = views.get(s), sizes[pane].height
            culprit = waits.culprit_rank(store, shown, s) if aggregate.banded(view, height) else None
            view, labels = aggregate.for_pane(view, height, hosts, culprit)
            pane.show(PaneState(view, mpc, self._cap_note() if ddp else "", cap_since if ddp else None,
                                nodes if labels is None else None, labels, plan_pct))
        key, rows = self._prepared_rows
        if key != (tuple(shown.items()), self._prepared) or not self._prepares():
            rows = figures_panel.compare_rows(store, shown)
        frame = Frame(store, shown, views, rows, self._prepares(), sizes)
        for panel in self.panels.values():
            if panel.display:
                panel.draw(frame)
        slow = waits.culprit_gist(store, shown)
        note = "" if slow else waits.gathering(store, shown)  # (no verdict before a full window)
        fr = frverdict.of_run(store.meta)  # (Flight Recorder dumps: their verdict, not figures)
        self.headline.show(headline.build(rows, figures.speedups(rows), self.size.width, slow, note,
                                          simulated_label(store.meta), shared_gpu_note(store.meta, rows),
                                          verdict=frverdict.headlines(fr) if fr is not None else None))
        self.title_line.show([statuslines.title(store, strategies, self.talk_title)])
        ops, grads, waited = _coll_ops(views)
        self.legend.show([statuslines.legend(mpc, self.vm.zoom, self.size.width, ops, allreduce=grads,
                                             waits=waited)])
        self.status_line.show([self._status(store)])
        self._notify_caps(store)
        if getattr(self.source, "recording_error", None) and not self._rec_error_said:  # (once)
            self._rec_error_said = True
            self.notify(self.source.recording_error, severity="warning", timeout=10)

    def _view(self, store: Store, strategy: str, step: int | None):
        """store.view, kept while nothing that shapes it (bucket assignments, events) changed."""
        if step is None:
            return None
        key = (id(store), strategy, step, store.view_stamp(strategy))
        got = self._views.get(key)
        if got is None:
            if len(self._views) > 64:
                self._views.clear()
            got = self._views[key] = store.view(strategy, step)
        return got

    def _sync_panes(self, store: Store, strategies: list[str]) -> bool:
        """A pane for each strategy, and none for a strategy no longer named (`ddptui run`
        names ddp until a rank's hello says the script's is FSDP2); True when one was mounted
        or removed."""
        src = (store.meta.layers, store.meta.params)
        same = self._names_of is not None and all(a is b for a, b in zip(src, self._names_of))
        if same and len(self.panes) == len(strategies) and all(s in self.panes for s in strategies):
            return False
        self._names_of = src
        layers = list(src[0] or [])
        params = [str(p[0]) for p in src[1] or []]
        mounted = False
        for s in [s for s in self.panes if s not in strategies]:
            self.panes.pop(s).remove()
            self._plan_key = None
            mounted = True
        for s in strategies:
            if s not in self.panes:
                self.panes[s] = TimelinePane(s, layers, params, id=f"pane-{s}")
                self.grid.mount(self.panes[s])
                mounted = True
            else:  # names known only once a rank said hello (ddptui run: the user's modules)
                self.panes[s].set_names(layers, params)
        return mounted

    def _sync_plan(self, store: Store, strategies: list[str]) -> None:
        w, h = self.size
        specs = [PanelSpec(name, cls.rows_min(store), cls.rows_max(store), cls.MIN_WIDTH, cls.GROW)
                 for name, cls in PANELS]
        key = (w, h, tuple(strategies), store.world, tuple(specs), self._banner_rows)
        if key == self._plan_key:
            return
        self._plan_key = key
        ranks = [store.expected_ranks(s) for s in strategies]
        plan = plan_screen(w, h, ranks, specs, self._banner_rows)
        grid = self.grid
        grid.styles.grid_size_columns = plan.cols
        grid.styles.grid_size_rows = len(plan.pane_rows)
        grid.styles.grid_rows = " ".join(str(x) for x in plan.pane_rows)
        shown = plan.shown
        for name, panel in self.panels.items():
            panel.display = name in shown
        pg = self.panel_grid
        pg.display = bool(plan.shelves)
        pg.styles.grid_size_columns = plan.panel_cols
        pg.styles.grid_size_rows = max(1, len(plan.shelves))
        pg.styles.grid_rows = " ".join(str(x) for x in plan.shelf_rows) or "1"
        pg.styles.height = sum(plan.shelf_rows)

    def shown_steps(self) -> dict[str, int | None]:
        """The step each strategy pane shows (live and following: those the Updater's thread
        last prepared a frame for)."""
        t = self.transport
        if t is None and not self.vm.paused and self._prepared_shown is not None and self._prepares():
            return dict(self._prepared_shown)
        return self.vm.shown_steps(self.source.store, t.position_step if t else None, replay=t is not None)

    def _ms_per_cell(self, views: dict, sizes: dict) -> float:
        lanes = [w for w in (sizes[p].width - GUTTER for p in self.panes.values()) if w > 0]
        lane_w = min(lanes) if lanes else max(10, self.size.width - GUTTER)
        return self.vm.ms_per_cell(views, lane_w, id(self.source.store))

    def _cap_note(self) -> str:
        return f"→ {self.asked_cap:g} MB asked…" if self.asked_cap is not None else ""

    def _status(self, store: Store) -> list:
        if self.transport is not None:
            state = statuslines.replay_state(self.transport, self._busy)
        else:
            rec_error = getattr(self.source, "recording_error", None)  # (the run goes on without it)
            state = statuslines.live_state(self.source, max(latest_steps(store), default=None), stopping=self._stopping,
                                    paused=self.paused, pinned=self.pinned, error=self.error,
                                    record=None if rec_error else self.record)
            if rec_error:
                why = rec_error.split(" stopped: ", 1)[-1].split(";", 1)[0]
                state.append((f" · recording stopped: {why}", theme.style(theme.WARN, bold=True)))
        gist = "" if self.panels["waits"].display else waits.compact(store, self.shown_steps())
        stuck = store.stall()  # (heartbeats: a hung collective, DDP's buckets included)
        fr = frverdict.of_run(store.meta)  # (Flight Recorder dumps: the first disagreement)
        said = stuck.short() if stuck else fr["short"] if fr is not None and frverdict.headlines(fr)[1] else ""
        return statuslines.status(store, state, gist, said, self._note_text())  # (note, verdict: first)

    def say(self, note: str) -> None:
        """A note on the status line for NOTE_S (a key that could not do all it says)."""
        self._note = (note, time.monotonic() + NOTE_S)
        self.redraw()

    def _note_text(self) -> str:
        note = self._note
        if note is None or time.monotonic() >= note[1]:
            return ""
        return note[0]

    def _draw_banner(self) -> None:
        src = self.source
        msg = self.error or (src.message if src.state == "failed" else None)
        text = f"✗ RUN FAILED — {msg}" if msg else ""
        banner = self.banner
        banner.display = bool(msg)
        self._banner_rows = 1 + len(text) // max(1, self.size.width - 2) if msg else 0
        if text != self._banner_text:
            self._banner_text = text
            banner.update(Text(text))  # error text is plain: never parse it as markup

    def _notify_caps(self, store: Store) -> None:
        changes = store.cap_history()
        for k, cap in changes[self._caps_seen:]:
            self.notify(f"DDP re-wrapped: bucket_cap_mb = {cap:g} MB from step {k}", timeout=2.5,
                        title="bucket cap applied")
            if self.asked_cap == cap:
                self.asked_cap = None
        self._caps_seen = len(changes)

    def redraw(self) -> None:
        """Draw now, with the newest data (the UI state changed: a key, a finished job; or a
        test wants the frame after a layout)."""
        self._ui_gen += 1
        self.vm.changed()
        self._redraw()


    # -- actions -----------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if isinstance(self.screen, StartupScreen):
            return action in self.ALWAYS
        if action in ("bucket", "straggler"):
            return self._controls(action)
        if action == "not_here":
            return not self._controls(*parameters)
        if action == "profile":
            return self.profiler is not None
        if action in ("speed", "goto"):
            return self.replay
        return True

    def _controls(self, what: str) -> bool:
        """Whether key b/B (what: bucket) or d (straggler) applies to this run."""
        return self.controls_why is None and (self.buckets if what == "bucket" else self.straggler) is not None

    @property
    def controls_why(self) -> str | None:
        """Why b, B and d (DDP's bucket cap, a straggler: asked of ddptui's own ranks) do not
        apply to this run; None where they may."""
        if getattr(self.source, "owns_ddp", False):  # (ddptui run: the user's script)
            return "b, B, d do not apply: the script owns its DDP (bucket cap, stragglers)"
        if self.transport is not None:
            return "b, B, d do not apply to a replay: the recorded run is over"
        if self.buckets is None and self.straggler is None:  # (an attached job, a file followed)
            return "b, B, d do not apply: this run is only watched, not driven by ddptui"
        return None

    def action_not_here(self, what: str) -> None:
        self.say(self.controls_why or f"{'b, B' if what == 'bucket' else 'd'}: not offered by this run")

    def action_pause(self) -> None:
        self._note = None  # (a key's note goes at the next key)
        if self.transport:
            self._transport(self.transport.toggle_play)
            return
        self.vm.toggle_pause(self.source.store)
        self.redraw()

    def action_step(self, delta: int) -> None:
        self._note = None
        if self.transport:
            t = self.transport
            self._transport(lambda: t.step_by(delta))
            return
        if self.vm.step(self.source.store, delta):
            self.redraw()

    def action_zoom(self, d: int) -> None:
        self._note = None
        before = self.vm.zoom
        self.vm.zoom_by(d)
        if self.vm.zoom == before:  # (at either end of the ladder)
            self.say(f"zoom {before}× shows the whole step: + zooms in" if d < 0 else
                     f"zoom {before}× is the closest: − zooms out")
            return
        self.redraw()

    def action_bucket(self, direction: int) -> None:
        nxt = next_bucket_cap(self.source.store, self.asked_cap, direction)
        if nxt is None:
            ladder = spec.BUCKET_LADDER_MB
            self.notify(f"bucket_cap_mb is at the {'bottom' if direction < 0 else 'top'} of the ladder "
                        f"({' / '.join(f'{x:g}' for x in ladder)} MB)", severity="warning")
            return
        if not self._started or self.buckets is None or self.buckets.set_bucket_cap(nxt) == 0:
            self.notify("no rank is connected yet: try again in a moment", severity="warning")
            return
        self.asked_cap = nxt
        self.notify(f"asked every rank for bucket_cap_mb = {nxt:g} MB (all re-wrap DDP at the same step)", timeout=2.5,
                    title="bucket cap")
        self.redraw()

    def action_straggler(self) -> None:
        """A straggler on the highest rank (its middle layer's backward half a step longer), or
        off again; every rank switches at the same step."""
        store = self.source.store
        ms = straggler_ask(store, self.straggler_ms)
        if not self._started or self.straggler is None or self.straggler.set_straggler(ms) == 0:
            self.notify("no rank is connected yet: try again in a moment", severity="warning")
            return
        self.straggler_ms = ms
        where = straggler_where(store)
        self.notify(f"straggler on: {where} backward +{ms:g} ms every step" if ms else "straggler off",
                    title="straggler", timeout=2.5)
        self.redraw()

    def action_profile(self) -> None:
        """An attached job: a torch.profiler window from every rank, written as a traces
        directory (`ddptui replay DIR` opens it), off the event loop; said when done."""
        if self._profiling:
            self.notify("a profile is being taken…")
            return
        self._profiling = True
        self.notify(f"taking {self.profile_s:g} s of torch.profiler from every rank…", title="profile")

        def pull() -> None:
            try:
                got = self.profiler.pull_profile(self.profile_s)
                lines, ok = got.lines(), got.ok
            except Exception as e:  # noqa: BLE001 - said; the app goes on
                lines, ok = [f"profile failed: {type(e).__name__}: {e}"], False
            finally:
                self._profiling = False
            self.call_from_thread(self.notify, "\n".join(lines), title="profile",
                                  severity="information" if ok else "warning", timeout=12)
        self.run_worker(pull, thread=True, name="profile", exit_on_error=False)

    def action_speed(self, d: int) -> None:
        self._note = None
        t = self.transport
        i = min(range(len(SPEEDS)), key=lambda j: abs(SPEEDS[j] - t.speed))
        nxt = SPEEDS[min(len(SPEEDS) - 1, max(0, i + d))]
        self._transport(lambda: t.set_speed(nxt))

    def action_goto(self) -> None:
        t = self.transport

        def go(step: int | None) -> None:
            self._note = None
            if step is None:
                return
            last = max(0, t.steps_total - 1)
            self._transport(lambda: t.seek(step))
            if not 0 <= step <= last:
                self.say(f"no step {step}: the recording has steps 0–{last}, "
                         f"went to {'the last' if step > last else 'the first'}")
        self.push_screen(GotoScreen(t.steps_total), go)

    def action_screenshot(self) -> None:
        name = f"ddptui-{time.strftime('%Y%m%d-%H%M%S')}.svg"
        try:
            path = self.save_screenshot(filename=name, path=self.screenshot_dir)
        except OSError as e:
            self.notify(f"screenshot failed: {e}", severity="error")
            return
        self.notify(f"screenshot saved: {os.path.abspath(path)}", title="screenshot")

    def action_output(self) -> None:
        """The ranks' own output (the script's prints) over the timelines."""
        if not isinstance(self.screen, OutputScreen):
            self.push_screen(OutputScreen(self.source.store))

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(spec.BUCKET_LADDER_MB))

    async def action_quit(self) -> None:
        if self._stopping:
            self.notify("still stopping the ranks…")
            return
        self._stopping = True
        self.notify("stopping ranks…", title="quit")
        self.redraw()
        self.run_worker(self._stop_source, thread=True, name="stop", exit_on_error=False)

    def _stop_source(self) -> None:
        code = self.exit_code()  # a failure seen before stopping still counts
        try:
            self.source.stop("stopped by user")
        finally:
            self.call_from_thread(self.exit, max(code, self.exit_code()))

    def exit_code(self) -> int:
        return 1 if self.source.state == "failed" or self.error else 0

    # -- transport jobs (replay): one at a time, off the event loop ----------------------------
    def _transport(self, job) -> None:
        self.jobs.put(job)
        self._ui_gen += 1

    @property
    def _busy(self) -> bool:
        return self.jobs.busy


def _coll_ops(views: dict) -> tuple[frozenset, bool, bool]:
    """The ops of the collectives (COLL spans) of the steps shown, 'unknown' for one its rank's
    table does not describe: the legend's entries for them (empty without any); whether any
    step shown has gradient AllReduces (COMM spans); and whether its first rank's compute
    stood waiting for a collective (WAIT)."""
    ops: set = set()
    grads = waited = False
    for v in views.values():
        if v is None:
            continue
        for r in v.spans:
            lane = Lane.of_spans(v.spans[r])
            place = lane.placement()
            grads = grads or bool(place.allreduce)
            waited = waited or bool(lane.waits)
            if v.colls:
                table = v.coll_table(r)
                for i in place.coll_idx:
                    row = table.get(i)
                    ops.add(row[1] if row is not None else "unknown")
            break  # (every rank issues the same collectives: the first rank's say which)
    return frozenset(ops), grads, waited
