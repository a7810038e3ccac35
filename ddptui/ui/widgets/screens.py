"""Start-up progress, help, and jump-to-step screens."""
from __future__ import annotations

import textwrap

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Input, Static

from ddptui.model.store import Store
from . import theme
from .text import Parts, PartsView

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
DONE, WAIT, FAIL, TODO = "✓", "…", "✗", "·"
MARK_STYLE = {DONE: theme.GOOD, FAIL: theme.ERROR, TODO: theme.DIM}
PAST_RENDEZVOUS = ("building", "training", "done")


def _item(mark: str, text: str, spin: str) -> Parts:
    shown = spin if mark == WAIT else mark
    colour = MARK_STYLE.get(mark, theme.WARN)
    return [(f" {shown} ", theme.style(colour, bold=True)),
            (text, theme.style(theme.ERROR if mark == FAIL else theme.TEXT, bold=mark == FAIL))]


RANKS_LISTED = 16  # up to this many ranks, a line each; beyond, counts (and who lags or failed)
NAMED_MAX = 8  # ranks named in a summary line before "+N more"


def _rank_item(r: int, info, spawned: bool, spin: str) -> Parts:
    if info is None:
        return _item(WAIT if spawned else TODO, f"rank {r}: waiting to connect", spin)
    if info.error or info.exit:
        return _item(FAIL, f"rank {r} {info.phase}: {info.error or info.exit}", spin)
    return _item(DONE, f"rank {r} connected — {info.device or '?'} · {info.backend or '?'} · {info.phase}", spin)


def _named(rs: list[int]) -> str:
    more = f", +{len(rs) - NAMED_MAX} more" if len(rs) > NAMED_MAX else ""
    return ", ".join(f"r{r}" for r in rs[:NAMED_MAX]) + more


def _ranks_summary(ranks: dict, world: int, spawned: bool, spin: str, width: int) -> list[Parts]:
    """Many ranks in a few lines: how many connected (on what), who still waits, who failed
    (each failure its own line, up to NAMED_MAX), and how many are in each phase."""
    missing = [r for r in range(world) if r not in ranks]
    failed = [r for r in sorted(ranks) if ranks[r].error or ranks[r].exit]
    kinds: dict[str, int] = {}
    phases: dict[str, int] = {}
    for info in ranks.values():
        k = f"{info.device or '?'} · {info.backend or '?'}"
        kinds[k] = kinds.get(k, 0) + 1
        phases[info.phase] = phases.get(info.phase, 0) + 1
    on = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])) or "none yet"
    lines = [_item(DONE if not missing else WAIT if spawned else TODO,
                   f"{len(ranks)}/{world} ranks connected — {on}", spin)]
    if missing and spawned:
        lines.append(_item(WAIT, f"waiting to connect: {_named(missing)}", spin))
    for r in failed[:NAMED_MAX]:
        lines.append(_rank_item(r, ranks[r], spawned, spin))
    if len(failed) > NAMED_MAX:
        lines.append(_item(FAIL, f"{len(failed) - NAMED_MAX} more ranks failed", spin))
    if phases:
        text = " · ".join(f"{p or '?'} {n}" for p, n in sorted(phases.items(), key=lambda kv: -kv[1]))
        lines.append(_item(DONE if set(phases) <= set(PAST_RENDEZVOUS) else WAIT, f"phases: {text}"[:max(20, width - 4)], spin))
    return lines


def startup_lines(store: Store, state: str, message: str, first_step_s: float | None,
                  elapsed: float, tick: int, width: int = 80) -> list[Parts]:
    """Honest progress: spawn, each rank connected, rendezvous, first step; or the failure."""
    spin = SPINNER[tick % len(SPINNER)]
    ranks = store.rank_snapshot()
    world = store.world
    log = store.log_lines()[-6:]
    meta = store.meta
    lines: list[Parts] = [
        [(f" starting {meta.model or '?'} on {world} rank(s) · {meta.note or ''}",
          theme.style(theme.TEXT, bold=True)), (f"   {elapsed:4.1f} s", theme.style(theme.DIM))], []]
    spawned = state not in ("created", "starting")
    lines.append(_item(DONE if spawned else WAIT, f"spawning torchrun ({world} rank(s))", spin))
    if world <= RANKS_LISTED:
        for r in range(world):
            lines.append(_rank_item(r, ranks.get(r), spawned, spin))
    else:
        lines += _ranks_summary(ranks, world, spawned, spin, width)
    phases = [ranks[r].phase if r in ranks else "" for r in range(world)]
    past = all(p in PAST_RENDEZVOUS for p in phases)
    lines.append(_item(DONE if past else WAIT if "rendezvous" in phases else TODO, "rendezvous", spin))
    first = DONE if first_step_s is not None else WAIT if past else TODO
    took = f" after {first_step_s:.1f} s" if first_step_s is not None else ""
    lines.append(_item(first, f"first step done{took}", spin))
    if state == "failed":
        lines += [[], [(" ✗ start-up failed ", theme.style("#000000", theme.ERROR, bold=True))]]
        lines += [[(f" {part}", theme.style(theme.ERROR, bold=True))]
                  for part in textwrap.wrap(message or "?", max(20, width - 2))]
        lines.append([(" press q to quit", theme.style(theme.TEXT))])
    lines += [[], [(" log", theme.style(theme.DIM, bold=True))]]
    colour = {"error": theme.ERROR, "warn": theme.WARN}
    lines += [[(f"   {text}", theme.style(colour.get(level, theme.DIM)))] for _, level, text in log]
    return lines


class StartupScreen(Screen):
    DEFAULT_CSS = """
    StartupScreen { background: #000000; }
    StartupScreen #startup-title { height: 1; }
    StartupScreen #startup-body { height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        yield PartsView(id="startup-title")
        yield PartsView(id="startup-body")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#startup-title", PartsView).show(
            [[(" ddptui ", theme.style("#000000", theme.TEXT, bold=True)), (" start-up", theme.style(theme.TEXT, bold=True))]])

    def show(self, lines: list[Parts]) -> None:
        found = self.query("#startup-body")
        if found:  # (not composed yet, or being dismissed: the app's tick comes at its rate)
            found.first(PartsView).show(lines)


HELP = """\
[b]Keys[/b]
  space      pause the view (live: training goes on, data is kept) · replay: play / pause
  ← / →      earlier / later step (live: pauses the view first)
  + / −      zoom the time axis in / out (all panes share one scale)
  b / B      ddptui's models: DDP bucket_cap_mb down / up the ladder {ladder} MB
  d          ddptui's models: a straggler on / off — the highest rank's middle layer backward takes
             half a step longer (every rank switches at the same step; the timeline marks it)
  [ / ]      replay: slower / faster (0.25× – 8×)
  g          replay: jump to a step
  s          save an SVG screenshot (the path is shown)
  o          the ranks' own output: the script's prints, stdout and stderr (r: one rank / all)
  p          attach: a torch.profiler window from every rank, saved as traces (replay them)
  ?          this help            q   quit (stops every rank cleanly)

[b]Reading a pane[/b]  one pane per strategy; per rank two lanes on one time axis from the step's start
  [#5aa9ff]███[/] forward per layer   [#3ddc84]███[/] backward per layer   (alternating shades, fcN = layer)
  [#ff9f1a]███[/] AllReduce (per parameter for naive, per bucket bN for DDP)   [#6b4a1e]███[/] queued behind another
  [#a3203c]███[/] ready, waiting for the other ranks   [#ff5fd7]███[/] the rank the others waited for (last to arrive)
  [#ffe14d]███[/] two or more AllReduces at once (one-row lanes; taller lanes give each a row)
  every other collective on the comm lane, by op: [#00d1d1]███[/] AG all-gather  [#b48cff]███[/] RS reduce-scatter
  [#ffc58f]███[/] AR the script's own all_reduce  [#dcdcff]███[/] A2A all_to_all  [#8d99ae]███[/] broadcast, barrier...
  labelled with the layer that issued it ("AG h.0"); counted in comm, exposed and AR+coll
  [#7d4b5a]███[/] wait, on the compute lane: the compute stood waiting for a collective's result (a
  tensor-parallel all_reduce waited on in its layer, a blocking call): exposed, not compute
  [#c8c8c8]███[/] optimizer     ⚑ marks the step where a new bucket cap took effect

[b]Figures[/b]  step ms: the step shown · the rest: medians of the last 100 steps (DDP: since the last
  bucket change) · comm % / exp %: communication and exposed communication as % of the step
  busy %: share of the step spent computing (forward, backward, less waits): the GPU utilisation
  NVML cannot give, strategies alternating step by step · GPU %: NVML over samples inside that
  strategy's steps ("–": steps shorter than a sample) · panels below show as room allows

[dim]press esc or ? to close[/dim]"""


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,question_mark", "app.pop_screen", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; background: #000000 60%; }
    HelpScreen > Vertical { width: 104; max-width: 100%; height: auto; max-height: 100%;
                            border: round #f0f0f0; background: #000000; padding: 0 1; }
    """

    def __init__(self, ladder: tuple[float, ...]):
        super().__init__()
        self.ladder = ladder

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text.from_markup(HELP.format(ladder=" → ".join(f"{x:g}" for x in self.ladder))))


class GotoScreen(ModalScreen):
    """Asks for a step number; dismisses with the int, or None when cancelled."""
    BINDINGS = [Binding("escape", "cancel", "cancel")]
    DEFAULT_CSS = """
    GotoScreen { align: center middle; background: #000000 60%; }
    GotoScreen > Vertical { width: 44; height: auto; border: round #f0f0f0; background: #000000; }
    """

    def __init__(self, steps_total: int):
        super().__init__()
        self.steps_total = steps_total

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(f" jump to step (0–{max(0, self.steps_total - 1)}), enter to go")
            yield Input(type="integer", placeholder="step", id="goto-step")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            self.dismiss(int(event.value))
        except ValueError:
            self.notify("type a step number", severity="warning")

    def action_cancel(self) -> None:
        self.dismiss(None)
