"""A widget that draws lines of styled parts and refreshes only when they change."""
from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

Parts = list[tuple[str, object]]


class PartsView(Widget):
    DEFAULT_CSS = """
    PartsView { height: 1; background: #000000; text-wrap: nowrap; text-overflow: clip; }
    """

    def __init__(self, **kw):
        super().__init__(**kw)
        self.lines: list[Parts] = []

    def show(self, lines: list[Parts]) -> None:
        if lines != self.lines:
            self.lines = lines
            self.refresh()

    def render(self) -> Text:
        out = Text(no_wrap=True, overflow="crop")
        for i, line in enumerate(self.lines):
            if i:
                out.append("\n")
            for text, st in line:
                out.append(text, st)
        return out

    @property
    def plain(self) -> str:
        return "\n".join("".join(t for t, _ in line) for line in self.lines)
