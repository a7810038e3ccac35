"""The status lines around the panes (one line each), as styled parts (no Textual): the title (model,
ranks, device, strategies), the legend (colours, then the time scale; entries drop off the
end when the line is short) and the status line (live or replay state, then what went
wrong: dropped spans, rejected frames, and the waits' gist when their panel has no room).
The app hands each a PartsView."""
from __future__ import annotations

from ranks import spec

from ddptui.model.gpu import gpu_text
from ddptui.model.runinfo import simulated_label
from ddptui.model.store import Store
from . import theme
from .text import Parts

# legend entries, most important first: the last ones go when the line is too short
LEGEND = (("forward", theme.FWD_A), ("backward", theme.BWD_A), ("AllReduce", theme.COMM_A),
          ("waits for ranks", theme.WAIT), ("last to arrive", theme.COMM_LAST), ("queued", theme.QUEUED),
          ("optimizer", theme.OPT), ("2+ at once", theme.COMM_MULTI))


def title(store: Store, strategies: list[str], talk_title: str | None = None) -> Parts:
    """The run in a line; a simulated run's label (SIMULATED, the profile) right after the name."""
    m = store.meta
    first = store.first_rank()
    # the GPU by name where the ranks said ('1x NVIDIA H100 80GB HBM3 (2 ranks share it)')
    device = gpu_text(m) or m.device or (first.device if first else "")
    backend = m.backend or (first.backend if first else "")
    ranks = f"{store.world} rank{'s' if store.world != 1 else ''}"
    bits = [str(m.model or "?"), ranks, device, backend,
            f"global batch {m.batch}" if m.batch else "", " vs ".join(strategies)]
    parts: Parts = [(" ddptui ", theme.style("#000000", theme.TEXT, bold=True))]
    label = simulated_label(m)
    if label is not None:  # (first after the name: a narrow title line keeps it)
        parts.append((f" {label} · not measured ", theme.style("#000000", theme.WARN, bold=True)))
    if talk_title:
        parts.append((f" {talk_title} ", theme.style(theme.WARN, bold=True)))
    parts.append((" " + " · ".join(b for b in bits if b), theme.style(theme.TEXT)))
    return parts


def coll_entries(ops, short: bool = False) -> tuple:
    """Legend entries of the collectives on screen (their ops), in spec.COLL_OPS order: 'AG
    all-gather', 'RS reduce-scatter', ...; ops drawn in one colour share an entry. short: as
    the lanes label them ('AG', 'RS', 'other', '?'), for a narrow line."""
    out, seen = [], set()
    for op in spec.COLL_OPS:
        if op in ops:
            c = theme.COLL_COLOURS.get(op, theme.COLL_OTHER)
            if c not in seen:
                seen.add(c)
                if c == theme.COLL_OTHER:
                    out.append(("other" if short else "other collective", c))
                else:
                    out.append((spec.COLL_SHORT[op] if short else f"{spec.COLL_SHORT[op]} {op.replace('_', '-')}", c))
    if "unknown" in ops:
        out.append(("?" if short else "unknown collective", theme.COLL_UNKNOWN))
    return tuple(out)


def legend(ms_per_cell: float, zoom: int, width: int = 1000, colls=(), allreduce: bool = True,
           waits: bool = False) -> Parts:
    """colls: the ops of the collectives on screen besides gradient AllReduces (COLL spans):
    their colours follow the AllReduce's entry. allreduce: whether any gradient AllReduce is
    on screen (with colls and none, as FSDP alone, 'AllReduce' and 'last to arrive', the
    AllReduce's colour for the last rank, are left out). waits: a compute lane on screen
    stood waiting for a collective (WAIT): its entry follows the collectives'."""
    text = f"│ 1 cell = {ms_per_cell:.3g} ms · zoom {zoom}×"
    if width >= 160:
        text += " · one scale for all panes"
    scale = (text, theme.style(theme.DIM))
    room = width - len(scale[0])
    parts: Parts = []
    if not colls:
        entries = LEGEND
    else:
        ce = coll_entries(colls)
        head = LEGEND[:3] if allreduce else LEGEND[:2]
        we = (("compute waits", theme.COMPUTE_WAIT),) if waits else ()
        if sum(len(name) + 5 for name, _ in head + ce + we) > room:  # (every collective's colour stays: AG, RS)
            ce = coll_entries(colls, short=True)
            if waits:  # (and the waits' too, as the lanes label them: the passes said short)
                we = (("wait", theme.COMPUTE_WAIT),)
                if sum(len(name) + 5 for name, _ in head + ce + we) > room:
                    head = (("fwd", theme.FWD_A), ("bwd", theme.BWD_A)) + head[2:]
        rest = LEGEND[3:] if allreduce else tuple(e for e in LEGEND[3:] if e[1] != theme.COMM_LAST)
        entries = head + ce + we + rest
    for name, c in entries:
        entry = [(" ██", theme.style(theme.LANE_COLOURS[c])), (f" {name} ", theme.style(theme.TEXT))]
        n = sum(len(t) for t, _ in entry)
        if n > room:
            break
        parts += entry
        room -= n
    return parts + [scale]


def live_state(src, latest: int | None, *, stopping: bool = False, paused: bool = False,
               pinned: int | None = None, error: str | None = None, record: str | None = None) -> Parts:
    """A live run's badge and state: stopping, paused (the step shown), failed, finished or live."""
    if stopping:
        return [(" ⏹ stopping ranks… ", theme.style("#000000", theme.WARN, bold=True))]
    if paused:
        parts = [(" ⏸ PAUSED ", theme.style("#000000", theme.WARN, bold=True)),
                 (f" step {pinned} · training continues (latest {latest}) · ←/→ step, space resumes",
                  theme.style(theme.TEXT))]
    elif src.state == "failed" or error:
        parts = [(" ✗ RUN FAILED ", theme.style("#ffffff", theme.ERROR, bold=True)),
                 (" press q to quit", theme.style(theme.TEXT))]
    elif src.state == "finished":
        parts = [(" ■ FINISHED ", theme.style("#000000", theme.TEXT, bold=True)),
                 (f" {src.message} · press q to quit", theme.style(theme.TEXT))]
    else:
        parts = [(" ● LIVE ", theme.style("#000000", theme.GOOD, bold=True)),
                 (f" {src.state} · step {latest if latest is not None else '–'}", theme.style(theme.TEXT))]
    if record:
        parts.append((f" · recording → {record}", theme.style(theme.DIM)))
    return parts


START_SAID_NS = 1_000_000_000  # a start-up cut this long is said, over the first steps
START_SAID_STEPS = 3


def replay_state(src, busy: bool = False) -> Parts:
    """A replay's badge, speed, position, file, and what it skipped or says."""
    badge = {"playing": " ▶ REPLAY ", "paused": " ⏸ REPLAY ", "finished": " ■ REPLAY "}.get(
        src.state, " REPLAY ")
    text = f" {src.speed:g}× · step {max(src.position_step, 0)}/{max(src.steps_total - 1, 0)}"
    text += f" · {src.name}" + (" · loop" if src.loop else "")
    if busy:
        text += " · seeking…"
    cut = getattr(src, "skipped_start_ns", 0)  # (the ranks' start-up, cut: recording.replay.LEAD_NS)
    if cut >= START_SAID_NS and src.position_step < START_SAID_STEPS:
        text += f" · start-up skipped ({cut / 1e9:.1f} s)"
    parts = [(badge, theme.style("#000000", theme.GOOD if src.playing else theme.WARN, bold=True)),
             (text, theme.style(theme.TEXT))]
    if src.skipped:
        parts.append((f" · {src.skipped} invalid frames skipped", theme.style(theme.ERROR, bold=True)))
    if src.message:
        parts.append((f" · {src.message}", theme.style(theme.WARN)))
    return parts


def status(store: Store, state: Parts, waits_gist: str = "", stall: str = "", note: str = "") -> Parts:
    """The state's badge, a key's note, a collective the ranks are stuck in (model/hang.py:
    which, and who never entered it; a Flight Recorder run's verdict), the rest of the state
    (a narrow line cuts it rather than the verdict), then what went wrong: dropped spans per
    rank, rejected frames, and the waits' gist ('' when the waits panel is on screen)."""
    parts = list(state[:1])
    if note:
        parts.append((f" {note} ·", theme.style(theme.WARN, bold=True)))
    if stall:
        parts.append((f" ⚠ {stall} ", theme.style("#ffffff", theme.ERROR, bold=True)))
    parts += state[1:]
    dropped = store.dropped_spans()
    if dropped:
        text = ", ".join(f"r{r} {n}" for r, n in dropped)
        parts.append((f" · dropped spans: {text}", theme.style(theme.ERROR, bold=True)))
    if store.rejected:
        parts.append((f" · rejected frames or connections: {store.rejected}", theme.style(theme.ERROR, bold=True)))
    if waits_gist:
        parts.append((f" · {waits_gist}", theme.style(theme.WARN, bold=True)))
    return parts
