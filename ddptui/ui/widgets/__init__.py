"""The UI's widgets: strategy timelines, the panels below them, start-up and help screens."""
from . import figures_panel, headline
from .buckets import BucketsPanel
from .figures_panel import FiguresPanel
from .gpu_panel import GpuPanel
from .headline import Headline
from .history import HistoryPanel
from .screens import GotoScreen, HelpScreen, StartupScreen
from .text import PartsView
from .timeline import GUTTER, PaneState, TimelinePane

__all__ = ["BucketsPanel", "FiguresPanel", "GpuPanel", "Headline", "HistoryPanel", "GotoScreen", "HelpScreen",
           "StartupScreen", "PartsView", "GUTTER", "PaneState", "TimelinePane", "figures_panel", "headline"]
