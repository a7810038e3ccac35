"""The ranks' own output (a training script's prints, stdout and stderr), over the timelines:
key `o`. Live it follows the newest lines; a replay shows what the recording holds up to the
moment replayed. Drawn by the app's frame clock (`refresh_from` at each tick while open: it
copies only the lines that came since), never per line."""
from __future__ import annotations

from collections import deque

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen

from ddptui.model.store import OUTPUT_KEPT, Store
from . import theme
from .text import Parts, PartsView


def build(kept, rank: int | None, width: int, rows: int, counts: tuple[int, int, int]) -> list[Parts]:
    """The pane's lines: a title (whose output, how many lines, what is not there), then the
    last lines that fit, each 'r0 ' then the line (stderr in the warning colour).
    `kept`: (time, rank, stream, line) oldest first; `counts`: (lines in all, lines memory no
    longer holds, lines the run did not record)."""
    total, forgotten, dropped = counts
    who = "every rank" if rank is None else f"rank {rank}"
    head: Parts = [(" script output ", theme.style("#000000", theme.TEXT, bold=True)),
                   (f" {who} · {total:,} line{'s' if total != 1 else ''}", theme.style(theme.TEXT))]
    if dropped:
        head.append((f" · {dropped:,} not recorded (over the output budget)", theme.style(theme.WARN)))
    if forgotten:
        head.append((f" · {forgotten:,} earlier not kept here", theme.style(theme.DIM)))
    head.append(("  r: one rank / all · o or esc: close", theme.style(theme.DIM)))
    lines: list[Parts] = [head]
    room = max(0, rows - 1)
    shown = [x for x in kept if rank is None or x[1] == rank][-room:] if room else []
    if not shown:
        lines.append([(" no output yet: the ranks' stdout and stderr show here (a recording made "
                       "before ddptui kept output has none)", theme.style(theme.DIM))])
    for _, r, stream, text in shown:
        lines.append([(f" r{r:<3}", theme.style(theme.DIM)),
                      (text, theme.style(theme.WARN if stream == "err" else theme.TEXT))])
    return lines


class OutputScreen(ModalScreen):
    BINDINGS = [Binding("escape,o", "app.pop_screen", "close"), Binding("r", "rank", "one rank / all")]
    DEFAULT_CSS = """
    OutputScreen { align: center middle; background: #000000 60%; }
    OutputScreen > Vertical { width: 100%; height: 100%; border: round #f0f0f0; background: #000000; }
    OutputScreen #output-body { height: 1fr; }
    """

    def __init__(self, store: Store):
        super().__init__()
        self.store = store
        self.seq = 0  # the store's output lines read so far
        self.kept: deque = deque(maxlen=OUTPUT_KEPT)  # (time, rank, stream, line), the last lines
        self.dropped = 0
        self.rank: int | None = None  # one rank's lines only (None: every rank's)
        self._drawn: tuple | None = None

    def compose(self) -> ComposeResult:
        with Vertical():
            yield PartsView(id="output-body")

    def on_mount(self) -> None:
        self.refresh_from(self.store)

    def refresh_from(self, store: Store) -> None:
        """Take the lines that came since the last call and draw, if anything changed."""
        if store is not self.store or store.output_seq < self.seq:  # (a replay sought back: a new store)
            self.store, self.seq = store, 0
            self.kept.clear()
        if store.output_seq != self.seq:
            self.seq, new, _lost, self.dropped = store.output_since(self.seq)
            self.kept.extend(new)
        found = self.query("#output-body")
        if not found:  # (not composed yet, or being dismissed: the app's tick comes at its rate)
            return
        body = found.first(PartsView)
        w, h = body.size.width, body.size.height
        key = (self.seq, self.rank, w, h, self.dropped)
        if key == self._drawn:
            return
        self._drawn = key
        body.show(build(self.kept, self.rank, w, h or 1, (self.seq, self.seq - len(self.kept), self.dropped)))

    def action_rank(self) -> None:
        ranks = sorted({x[1] for x in self.kept})
        if not ranks:
            return
        self.rank = ranks[0] if self.rank is None else next((r for r in ranks if r > self.rank), None)
        self.refresh_from(self.store)

    def on_resize(self) -> None:
        self.refresh_from(self.store)
