"""A widget that draws lines of styled parts and refreshes only when they change.

Lines are drawn with Textual's Line API: each part is a Segment with its Rich style, cut to
the widget's width, so a status line redrawn at every step costs a few Segments, not a
parse of rich Text into Textual's Content. Control characters (a rank's error message may
hold a newline) are drawn as spaces: a line stays one line.
"""
from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip
from textual.widget import Widget

from . import theme

Parts = list[tuple[str, object]]

_CONTROL = {c: " " for c in (*range(32), 127)}


def _segment(text: str, style) -> Segment:
    if not text.isprintable():
        text = text.translate(_CONTROL)
    return Segment(text, style if isinstance(style, Style) or style is None else Style.parse(str(style)))


class PartsView(Widget):
    DEFAULT_CSS = """
    PartsView { height: 1; background: #000000; text-wrap: nowrap; text-overflow: clip; }
    """

    def __init__(self, **kw):
        super().__init__(**kw)
        self.lines: list[Parts] = []
        self._width: int | None = None  # as of this render (Widget.size looks the widget up)
        self._strips: dict[tuple[int, int], Strip] = {}  # (line, width) -> strip, for these lines

    def show(self, lines: list[Parts]) -> None:
        if lines != self.lines:
            self.lines = lines
            self._strips = {}
            self.refresh()

    def render_lines(self, crop):
        self._width = self.size.width
        return super().render_lines(crop)

    def render_line(self, y: int) -> Strip:
        width = self._width if self._width is not None else self.size.width
        key = (y, width)
        got = self._strips.get(key)
        if got is None:
            parts = self.lines[y] if 0 <= y < len(self.lines) else ()
            got = Strip([_segment(t, s) for t, s in parts if t]).adjust_cell_length(width, theme.style())
            self._strips[key] = got
        return got

    @property
    def plain(self) -> str:
        return "\n".join("".join(t for t, _ in line) for line in self.lines)
