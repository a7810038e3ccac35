"""Colours and cached styles. High contrast on black: it has to read on a projector."""
from __future__ import annotations

from functools import lru_cache

from rich.style import Style

BG = "#000000"
TRACK = "#262626"  # an empty lane cell: lanes stay visible as tracks
TEXT = "#f0f0f0"
DIM = "#8a8a8a"
WARN = "#ffd33d"
ERROR = "#ff4d4d"
GOOD = "#4cd964"

# colour ids of lane cells (index into LANE_COLOURS)
EMPTY, FWD_A, FWD_B, BWD_A, BWD_B, COMM_A, COMM_B, QUEUED, OPT, COMM_MULTI, WAIT, COMM_LAST, OTHER = range(13)
LANE_COLOURS = (
    TRACK,
    "#5aa9ff", "#2f6fd0",  # forward: light / dark blue, alternating per layer
    "#3ddc84", "#1c9a55",  # backward: light / dark green
    "#ff9f1a", "#e0501b",  # AllReduce: orange / red-orange, alternating per call
    "#6b4a1e",  # AllReduce issued but not yet running (queued)
    "#c8c8c8",  # optimizer
    "#ffe14d",  # two or more AllReduces running at once (where the lane has one row)
    "#a3203c",  # AllReduce ready here, waiting for the other ranks to be ready
    "#ff5fd7",  # AllReduce of the rank that arrived last (the others waited for it)
    "#4b4b63",  # other time: a rank's own work that synchronises nothing (an evaluation)
    # every other collective (COLL spans), coloured by op, two shades alternating per call:
    "#00d1d1", "#00838f",  # all_gather (FSDP's parameters): cyan
    "#b48cff", "#7c4dff",  # reduce_scatter (FSDP's gradients): violet
    "#ffc58f", "#c8783a",  # all_reduce of the script's own (not a gradient bucket): tan
    "#dcdcff", "#9a9ad8",  # all_to_all: lavender
    "#8d99ae", "#5c677d",  # broadcast, barrier, reduce, gather, scatter, send, recv: slate
    "#6e6e6e",  # a collective its rank's table does not describe (unknown)
    "#7d4b5a",  # the compute standing waiting for a collective's result (tensor parallel, blocking)
)
# label text on each bar colour
LABEL_ON = ("#ffffff", "#000000", "#ffffff", "#000000", "#ffffff", "#000000", "#ffffff", "#ffffff", "#000000",
            "#000000", "#ffffff", "#000000", "#b4b4c8",
            "#000000", "#ffffff", "#000000", "#ffffff", "#000000", "#ffffff", "#000000", "#000000",
            "#000000", "#ffffff", "#ffffff", "#ffffff")
(COLL_AG, _, COLL_RS, _, COLL_AR, _, COLL_A2A, _, COLL_OTHER, _, COLL_UNKNOWN) = range(13, 24)
COMPUTE_WAIT = 24  # the compute lane where the rank stood waiting for a collective (a WAIT)
# a collective's op -> its first shade (the second: + 1); ops not listed: COLL_OTHER
COLL_COLOURS = {"all_gather": COLL_AG, "reduce_scatter": COLL_RS, "all_reduce": COLL_AR,
                "all_to_all": COLL_A2A}

STRATEGY_COLOURS = {"naive": "#ff6b6b", "interleaved": "#c792ea", "ddp": "#4cd964", "single": "#8ab4f8", "fsdp": "#ffb454",
                    "gpipe": "#40c8e0", "1f1b": "#ffd426"}  # (the other pipelines: the text colour)

# left-aligned eighth blocks: LEFT_EIGHTHS[n] covers n/8 of a cell from the left
LEFT_EIGHTHS = " ▏▎▍▌▋▊▉█"
SPARK = " ▁▂▃▄▅▆▇█"


@lru_cache(maxsize=None)
def style(fg: str | None = None, bg: str = BG, bold: bool = False) -> Style:
    return Style(color=fg, bgcolor=bg, bold=bold or None)


def full_style(c: int) -> Style:
    col = LANE_COLOURS[c]
    return style(col, col)


def mixed_style(left: int, right: int) -> Style:
    return style(LANE_COLOURS[left], LANE_COLOURS[right])


def label_style(c: int) -> Style:
    return style(LABEL_ON[c], LANE_COLOURS[c], bold=True)


def strategy_colour(name: str) -> str:
    return STRATEGY_COLOURS.get(name, TEXT)


def spark(values, lo: float = 0.0, hi: float = 100.0, width: int | None = None) -> str:
    """A sparkline on a fixed scale [lo, hi]; None (N/A) draws as '·'."""
    vals = list(values)[-width:] if width else list(values)
    out = []
    span = (hi - lo) or 1.0
    for v in vals:
        if v is None:
            out.append("·")
            continue
        f = min(1.0, max(0.0, (v - lo) / span))
        out.append(SPARK[max(1, round(f * 8))])
    return "".join(out)
