"""The panels below the lanes: each says how much room it wants, the screen plan places them
by priority (ddptui.ui.viewmodel.plan_screen), and each draws itself from one Frame.

A new panel: subclass Panel, give it rows_min/rows_max (0 rows: nothing to show now),
MIN_WIDTH, GROW (takes the rows nobody else wants) and build_lines(frame); add it to
ddptui.ui.app.PANELS at its priority.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from textual.geometry import Size

from ddptui.model.store import Store
from ddptui.model.views import StepView
from .text import Parts, PartsView


@dataclass
class Frame:
    """What every panel draws from, built once per redraw."""
    store: Store
    shown: dict[str, int | None]  # the step each strategy pane shows
    views: dict[str, StepView | None]
    rows: list[dict] = field(default_factory=list)  # the comparison rows (figures_panel.compare_rows)
    prepared: bool = False  # live: the Updater's thread made the slow parts (a panel reads its caches)
    sizes: dict = field(default_factory=dict)  # widget -> its size, taken once for the frame


class Panel(PartsView):
    DEFAULT_CSS = """
    Panel { height: 100%; width: 1fr; background: #000000; padding: 0 1; }
    """
    MIN_WIDTH = 40
    GROW = False

    @staticmethod
    def rows_min(store: Store) -> int:
        return 1

    @staticmethod
    def rows_max(store: Store) -> int:
        return 1

    def build_lines(self, frame: Frame) -> list[Parts]:
        return []

    geom = Size(0, 0)  # the size as of this draw (Widget.size looks the widget up each time)

    def draw(self, frame: Frame) -> None:
        self.geom = frame.sizes.get(self) or self.size
        self.show(self.build_lines(frame))

    @property
    def inner(self) -> tuple[int, int]:
        """Width and height to draw in, as of this draw (Widget.size is the content area:
        the padding is already left out)."""
        return self.geom.width, self.geom.height
