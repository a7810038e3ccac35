"""The headline: one line that says what the audience should see, and never overflows.

Candidates go from the fullest sentence to the shortest; the first that fits the width is
shown. The sentence is honest either way: DDP slower than naive says "slower"; a simulated
run's says SIMULATED first. It never speaks from the warm-up: the summaries leave a
window's first step out, and until every strategy shown has SETTLED steps past it (a
median of them: DDP's own first rebuild of its buckets is one more slow step) the line
says it waits for them rather than give warm-up figures (an H100 run's first steps read
"DDP 3.76× faster", then "0.60×", where it runs 1.25×).
"""
from __future__ import annotations

from rich.cells import cell_len

from . import theme
from .text import Parts, PartsView

SAME = 0.005  # within this of 1.0: "about the same"
SETTLED = 3  # steps past a window's first (the warm-up) that a strategy's figures need


def warming(rows: list[dict]) -> tuple[int, int] | None:
    """(steps past the warm-up, SETTLED) of the strategy with the fewest, while one that has a
    step has fewer than SETTLED; None once all have (or none has a step yet)."""
    got = [int(r["steps"]) - 1 for r in rows if r.get("steps")]
    least = min(got, default=SETTLED)
    return (max(0, least), SETTLED) if least < SETTLED else None


def _pct(v: float) -> str:
    return f"{v:.0f} %"


def _vs(v: float) -> str:
    return f"{v:.2f}×"


def _hidden_verdict(pct: float) -> str:
    """A share of communication hidden behind compute, told alone: good from half of it, else
    said as a warning (most of it exposed: a tensor-parallel all_reduce, gloo's blocking
    collectives, waited for where they are issued)."""
    return "good" if pct >= 50 else "same"


def candidates(sp: dict, overlap: dict, bubble: dict | None = None) -> list[tuple[str, str]]:
    """(text, verdict) from the fullest to the shortest; verdict: good | bad | same | none.

    `sp`: speedups (ddptui.model.figures.speedups: ddp_vs_naive, X_vs_single); `overlap`: the
    share (%) of each strategy's communication hidden behind compute (None: no comm)."""
    v = sp.get("ddp_vs_naive")
    hid = overlap.get("ddp")
    if v is not None:
        hidden = [] if hid is None else [
            f" — {_pct(hid)} of communication hidden behind backward",
            f" — {_pct(hid)} of comm hidden",
            f" · {_pct(hid)} hidden"]
        if abs(v - 1) < SAME:
            head = [f"DDP as fast as naive ({_vs(v)})", f"DDP ≈ naive ({_vs(v)})"]
            verdict = "same"
        elif v > 1:
            head = [f"DDP {_vs(v)} faster than naive", f"DDP {_vs(v)} faster"]
            verdict = "good"
        else:
            slower = (1 / v - 1) * 100 if v > 0 else float("inf")
            head = [f"DDP slower than naive here ({_vs(v)}, steps {slower:.0f} % longer)",
                    f"DDP slower than naive here ({_vs(v)})", f"DDP slower ({_vs(v)})"]
            verdict = "bad"
        out = [(h + t, verdict) for h in head for t in hidden]
        return out + [(h, verdict) for h in head]
    singles = {k[:-10]: x for k, x in sp.items() if k.endswith("_vs_single")}
    if singles:
        best = max(singles, key=singles.get)
        x = singles[best]
        word = "faster than" if x > 1 + SAME else "slower than" if x < 1 - SAME else "as fast as"
        return [(f"{best.upper() if best == 'ddp' else best} {_vs(x)} {word} one device", "good" if x > 1 else "bad"),
                (f"{best} {_vs(x)} vs single", "none")]
    if bubble:  # a pipeline: its bubble, the figure its users tune
        name, x = max(bubble.items(), key=lambda kv: kv[1])
        verdict = "good" if x < 20 else "same" if x < 50 else "bad"
        return [(f"{name}: each stage idle {_pct(x)} of its step (the pipeline's bubble)", verdict),
                (f"{name}: bubble {_pct(x)} of the step", verdict), (f"{name} bubble {_pct(x)}", verdict)]
    if hid is not None:
        return [(f"DDP hides {_pct(hid)} of its communication behind backward", _hidden_verdict(hid)),
                (f"DDP: {_pct(hid)} comm hidden", _hidden_verdict(hid))]
    alone = [(k, x) for k, x in overlap.items() if x is not None]
    if len(alone) == 1:  # one strategy alone (a script's FSDP2 under `ddptui run`): what it hides
        name, x = alone[0]
        name = "FSDP" if name == "fsdp" else name
        return [(f"{name} hides {_pct(x)} of its communication behind compute", _hidden_verdict(x)),
                (f"{name}: {_pct(x)} comm hidden", _hidden_verdict(x))]
    return [("waiting for complete steps of two strategies to compare…", "none"), ("waiting…", "none")]


def headline(sp: dict, overlap: dict, width: int = 80, slow: str = "", note: str = "",
             why: list[str] | tuple = (), bubble: dict | None = None) -> tuple[str, str]:
    """The fullest candidate within `width` cells (the shortest, cut, if none fits). `slow`:
    a straggler in words ('rank 1 · fc2 backward +40 ms'), said first when there is one;
    else `note` ('gathering evidence (3/20 steps)': no verdict yet), said last where it fits.
    `why`: what explains the figures, fullest first (ranks sharing one GPU over gloo:
    ddptui.model.gpu.shared_gpu_note): its fullest form that fits after any form of the
    sentence comes before the sentence alone (the lesson before the long wording). `bubble`:
    a pipeline's bubble (%) by strategy."""
    cands = candidates(sp, overlap, bubble)
    if why:
        cands = [(f"{t} · {w}", v) for w in why for t, v in cands] + cands
    if slow:
        cands = [(f"{t} · slow: {slow}", v) for t, v in cands] + [(f"slow: {slow}", "bad")] + cands
    elif note:  # (each sentence with the note, then without: the figures come first)
        cands = [c for t, v in cands for c in ((f"{t} · {note}", v), (t, v))]
    return fitted(cands, width)


def fitted(cands: list[tuple[str, str]], width: int) -> tuple[str, str]:
    """The first candidate within `width` cells, else the last one cut."""
    for text, verdict in cands:
        if cell_len(text) <= width:
            return text, verdict
    text, verdict = cands[-1]
    return text[:max(0, width - 1)] + "…" if width > 0 else "", verdict


COLOUR = {"good": theme.GOOD, "bad": theme.ERROR, "same": theme.WARN, "none": theme.DIM}


def build(rows: list[dict], sp: dict, width: int, slow: str = "", note: str = "",
          label: str | None = None, why: list[str] | tuple = (),
          verdict: tuple[list[str], bool] | None = None) -> list[Parts]:
    """`label`: a simulated run's ('SIMULATED · 4x A100 80GB PCIe · 4 GPUs'), said first, whole
    where the sentence keeps 40 cells, else 'SIMULATED' alone. `verdict`: Flight Recorder dumps'
    (model/frverdict.headlines: its sentences, fullest first, and whether they name a hang),
    said instead of any figure (dumps have no steps to compare)."""
    if verdict is not None:
        text, v = fitted([(t, "bad" if verdict[1] else "good") for t in verdict[0] if t], max(0, width - 2))
        return [[(" " + text + " ", theme.style("#000000", COLOUR[v], bold=True))]]
    overlap = {r["strategy"]: r.get("overlap_pct") for r in rows}
    bubble = {r["strategy"]: r["bubble_pct"] for r in rows if r.get("bubble_pct") is not None}
    warm = warming(rows)
    head: Parts = []
    if label is not None:
        tag = f" {label} " if width - cell_len(label) - 2 >= 40 else " SIMULATED "
        head = [(tag, theme.style("#000000", theme.WARN, bold=True))]
        width -= cell_len(tag)
    if warm is not None:  # (no figure of the warm-up)
        wait = [(f"waiting for steps past the warm-up to compare ({warm[0]}/{warm[1]})…", "none"),
                (f"warming up ({warm[0]}/{warm[1]})…", "none")]
        if slow:  # (the per-layer evidence's, not a warm-up figure)
            wait = [(f"slow: {slow} · {t}", "bad") for t, _ in wait] + [(f"slow: {slow}", "bad")] + wait
        text, verdict = fitted(wait, max(0, width - 2))
    else:
        text, verdict = headline(sp, overlap, max(0, width - 2), slow, note, why, bubble)
    return [head + [(" " + text + " ", theme.style("#000000" if verdict != "none" else theme.TEXT,
                                               COLOUR[verdict] if verdict != "none" else theme.BG, bold=True))]]


class Headline(PartsView):
    DEFAULT_CSS = """
    Headline { height: 1; }
    """
