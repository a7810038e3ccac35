"""A widget that draws lines of styled parts and refreshes only when they change.

Lines are drawn with Textual's Line API: each part is a Segment with its Rich style, cut to
the widget's width, so a status line redrawn at every step costs a few Segments, not a
parse of rich Text into Textual's Content. Control characters (a rank's error message may
hold a newline) are drawn as spaces: a line stays one line. A line longer than the width
ends with an ellipsis, cut after its last whole field (' · ') or word that fits (`fit`);
spaces past the width are cut as they are.
"""
from __future__ import annotations

from rich.cells import cell_len
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


ELLIPSIS = "…"
FIELD = " · "


def _chars(text: str, cells: int) -> int:
    """How many of text's characters fit in `cells`."""
    if text.isascii():
        return min(len(text), cells)
    used = 0
    for i, ch in enumerate(text):
        used += cell_len(ch)
        if used > cells:
            return i
    return len(text)


def fit(parts: Parts, width: int) -> Parts:
    """`parts` cut to `width` cells: unchanged when it fits (or all it has past the width is
    spaces), else up to the last field separator (' · ') in the line's second half, or the
    last space, or mid-word when there is neither, then '…'."""
    total = sum(cell_len(t) for t, _ in parts)
    if total <= width or width <= 0:
        return parts
    plain = "".join(t for t, _ in parts)
    if not plain[_chars(plain, width):].strip():
        return parts  # (padding: cut as it is)
    room = width - 1  # (the ellipsis' cell)
    cut = _chars(plain, room)
    at = plain.rfind(FIELD, 0, cut + len(FIELD))  # (a boundary at `cut` keeps all of it)
    if at < room // 2:
        at = plain.rfind(" ", 0, cut + 1)
    if at > 0:
        cut = len(plain[:at].rstrip())
    out: Parts = []
    left = cut
    for t, st in parts:
        if left <= 0:
            break
        out.append((t[:left], st))
        left -= len(t)
    style = out[-1][1] if out else None
    return out + [(ELLIPSIS, style)]


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
            got = Strip([_segment(t, s) for t, s in fit(parts, width) if t]).adjust_cell_length(width, theme.style())
            self._strips[key] = got
        return got

    @property
    def plain(self) -> str:
        return "\n".join("".join(t for t, _ in line) for line in self.lines)
