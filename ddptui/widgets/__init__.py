"""The UI's widgets: strategy timelines, figures, GPU panel, start-up and help screens."""
from .figures_panel import FiguresPanel
from .gpu_panel import GpuPanel
from .screens import GotoScreen, HelpScreen, StartupScreen
from .text import PartsView
from .timeline import GUTTER, PaneState, TimelinePane

__all__ = ["FiguresPanel", "GpuPanel", "GotoScreen", "HelpScreen", "StartupScreen", "PartsView",
           "GUTTER", "PaneState", "TimelinePane"]
