"""The store: every source (live ranks, a replay file) feeds frames in; the UI, the
recorder's summary and the headless report read figures out.

Ingest is cheap (columns are kept as they arrive); figures are computed by update(),
off the collector thread: while a run is live by one Updater thread (updater.py), else by
whoever reads. Raw spans are kept for the last
``keep_steps`` steps of each strategy and per-step figures for the last ``keep_figures``,
so memory stays bounded however long the run.

`Store` is made of three parts, one job each, sharing the state declared (once, a comment
per field) in `Store.__init__` below and its one lock:

- intake.py   `Intake`: frames in (ingest's checks, one handler per frame type, set_meta, add_log);
- figuring.py `Figuring`: figures of complete steps (update, eviction, rank_figures,
  bucket_figures, multi-node clock samples);
- queries.py  `Queries`: every read-only query, each under the lock, returning copies.

Beside them: rankinfo.py (`RankInfo`, one rank's state) and history.py (`in_force`, what a
step-ordered history holds at a step).
"""
from __future__ import annotations

import threading
from collections import OrderedDict, deque

from ranks import frames
from ranks.wire import SpanBatch

from .. import figures
from .. import stragglers
from ..clocksync import HostClocks
from ..runinfo import RunInfo
from .figuring import Figuring
from .history import in_force
from .intake import Intake
from .queries import Queries
from .rankinfo import RankInfo

__all__ = ["Store", "RankInfo", "in_force"]

OUTPUT_KEPT = 2000  # lines of the ranks' own output kept in memory (the output pane's)


class Store(Intake, Figuring, Queries):
    def __init__(self, keep_steps: int = 400, keep_figures: int = 20000):
        self.lock = threading.RLock()  # one lock over everything below (re-entrant: queries call queries)
        self.version = 0  # +1 on every change (a frame, meta, a log line, published figures): readers redraw
        self.keep_steps = keep_steps  # raw spans (and what goes with them) kept per strategy, in steps
        self.keep_figures = keep_figures  # per-step figures kept per strategy, in steps
        self.meta = RunInfo()  # what the run is (typed; .as_dict() for the header's map)
        self.ranks: dict[int, RankInfo] = {}  # rank -> what is known of it
        # strategy -> step -> rank -> its span batch, oldest step first (the last keep_steps)
        self.raw: dict[str, OrderedDict[int, dict[int, SpanBatch]]] = {}
        self._strategies: tuple | None = None  # (the strategies named, len(raw), the list): asked many times a frame
        # strategy -> step -> figures of a complete step, oldest first (the last keep_figures)
        self.step_figs: dict[str, OrderedDict[int, figures.StepFigures]] = {}
        self.rank_figs: dict[tuple[str, int, int], figures.RankStep] = {}  # (strategy, step, rank), kept like raw
        self.bucket_figs: dict[tuple[str, int], dict] = {}  # (strategy, step) of complete steps
        # (strategy, rank) -> [ms of communication, ms of it overlapped by compute, over every
        # complete step (never evicted), the newest step, its two ms] (figures.hta_step: HTA's
        # comm/comp overlap, which leaves a trace's last step out: Queries.hta_overlap)
        self.hta_acc: dict[tuple[str, int], list] = {}
        # strategy -> the steps in which a rank waited hang.STALL_S or more inside one collective,
        # in the order published (the first STALLS_KEPT; never evicted), and how many more
        # (Figuring._note_stall: step, step ms, {waiting rank: ms}, the rank waited for, kind, idx)
        self.stalls: dict[str, list[tuple]] = {}
        self.stalls_more: dict[str, int] = {}
        # DDP's bucket assignment: (strategy, rank) -> each change as reported, in step order:
        # (step, {bucket: bytes}, [[bucket, [param idx...], bytes], ...])
        self.bucket_assignments: dict[tuple[str, int], list[tuple[int, dict[int, int], list]]] = {}
        self.reported_sizes: dict[tuple[str, int], list[int]] = {}  # bucket sizes DDP itself reports
        # every other collective a rank issued (COLL spans' idx): (strategy, rank) -> id -> its
        # row (id, op, bytes, group size, group, layer, phase, async), as the colls frames said
        self.collectives: dict[tuple[str, int], dict[int, tuple]] = {}
        # of those rows, the ones on a group other than the default one: (strategy, rank) -> id
        # -> (the lowest rank of its group where that is some of the ranks and says so (a device
        # mesh dimension's: 'mesh_tp@2'), else None; its group_label: 'tp'); who waits for whom
        # matches those within their group, and says the waits per group
        self.coll_group_rows: dict[tuple[str, int], dict[int, tuple[int | None, str]]] = {}
        self.events: list[tuple[int, str, str]] = []  # (step, strategy, text)
        self.cap_changes: list[tuple[int, float]] = []  # (step, bucket_cap_mb) as applied
        # how DDP's buckets were timed (event comm_timing): rank -> "comm-hook" or
        # "flight-recorder"; and buckets PyTorch's timing did not cover (event fr_untimed)
        self.comm_timing: dict[int, str] = {}
        self.fr_untimed: dict[int, int] = {}
        # functional collectives torch.compile traced into its graphs (events `traced <op>`,
        # `traced_b <op>`): rank -> op -> [count, bytes, steps they ran over]; untimed
        self.traced_colls: dict[int, dict[str, list[int]]] = {}
        # layer marks skipped in a CUDA graph's capture (event captured_marks), by rank
        self.graph_marks: dict[int, int] = {}
        self.slow_changes: list[tuple[int, float, int, int]] = []  # (step, ms, rank, layer) as applied
        self.waits: dict[str, OrderedDict[int, stragglers.StepWaits | None]] = {}  # kept like raw spans
        # (strategy, step) -> (start ns, end ns) of a complete step on CLOCK_MONOTONIC, kept like raw spans
        self._intervals: dict[tuple[str, int], tuple[int, int]] = {}
        self.log: deque[tuple[float, str, str]] = deque(maxlen=500)  # (time, level, text)
        self.log_seq = 0  # lines ever logged (the deque keeps the last 500): readers follow this
        # the ranks' own output (a script's prints): (time, rank, stream, line), the last OUTPUT_KEPT
        self.output: deque[tuple[float, int, str, str]] = deque(maxlen=OUTPUT_KEPT)
        self.output_seq = 0  # output lines ever received (readers follow this, as the log's)
        self.output_dropped = 0  # output lines the run dropped, not recorded (the frames' counts)
        self.gpu: deque[frames.Gpu] = deque(maxlen=600)  # the latest GPU samples
        self.cpu: deque[frames.Cpu] = deque(maxlen=600)  # the latest CPU samples
        self.spans = 0  # span events ever stored
        # strategy -> [steps with layers marked, steps without] (rank 0's; layer marks on a
        # sample of steps: ranks.core.sampling.LAYER_SHARE)
        self.layer_marks: dict[str, list[int]] = {}
        # strategy -> the last steps whose layers were marked (rank 0's; 3 x stragglers.RECENT:
        # some may never complete): where layers are marked on a sample of steps, the last
        # 2 x RECENT complete ones stay past keep_steps (RECENT up to a step on screen behind the newest) (`stays`, Figuring._evict: the per-layer
        # evidence judges them; at 1 step in 64, 400 steps hold 6); they are not among the
        # steps the who-waits figures and the view's window are over
        self.marked: dict[str, deque[int]] = {}
        self.stays: dict[str, frozenset] = {}
        self.rejected = 0  # frames or connections refused (reject frames)
        self._param_bytes: list[int] = []  # each parameter's gradient bytes (non-DDP AllReduce sizes)
        # (strategy, rank) -> the figures' lookups of its bytes and collectives rows, with what
        # they were made from (Figuring: made again only when that changed)
        self._bytes_fns: dict[tuple[str, int], tuple] = {}
        self._row_fns: dict[tuple[str, int], tuple] = {}
        self._limits = frames.Limits()  # what frames are checked against (from meta)
        self._dirty: dict[str, set[int]] = {}  # strategy -> steps with new spans since update()
        # multi-node: rank -> node, node -> clock frame (its offset onto node 0's axis)
        self.host_clocks = HostClocks()
        self.node_of: dict[int, int] = self.host_clocks.node_of  # (the same dicts, read by queries)
        self.clocks: dict[int, frames.Clock] = self.host_clocks.clocks
        self._shift: dict[tuple[str, int], dict[int, int]] = {}  # (strategy, step) -> rank -> raw - mapped
        self._coll: dict[int, deque] = {}  # node -> its latest collectives against node 0 (CollSample)
