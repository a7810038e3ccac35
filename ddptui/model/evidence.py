"""Who is slow, from per-layer evidence: each rank's forward and backward of each layer
against the other ranks' median for it, step by step, judged over a window of steps.

Arrival order (ddptui/model/stragglers.py) says whom the others waited for; when ranks share busy
cores it is noisy (either rank is now and then tens of ms late). A rank whose layer is slow
is slow in every step, so the evidence here is per section (a layer's forward or backward):

    excess (rank r, section, step) = r's duration - median of the other ranks' durations

Over a window of W steps (default 20), rank r is slow in a section when both hold:

1. **sign test**: r was slower than the others' median in at least `need` of the W steps.
   Exact and distribution-free: with no real difference (each step's excess as likely above
   zero as below, steps independent) the chance that any of the m = ranks x sections
   one-sided tests passes in a window is at most m * P(Bin(W, 1/2) >= need), and `need` is
   the smallest count that keeps this bound at or below ALPHA (1 %). W = 20, 2 ranks,
   medium (5 layers, 10 sections, m = 20): need = 18, bound 0.40 %.
2. **size**: r's median excess over the window is at least MIN_EXCESS_MS and MIN_EXCESS_REL
   of the others' median duration for that section: the sign test alone would name a steady
   difference too small to matter (one rank sharing its core with the app).

The window's spread is its median absolute deviation (MAD) of the excess. The culprit is
the slow (rank, section) with the largest median excess: "rank 1 · fc2 backward +40 ms".
Pure functions over `Sections` (rank -> (pass, layer) -> ms of one step); the Store keeps
one per step with who waited for whom (`StepWaits.sections`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import comb
from statistics import median

from ranks.wire import BWD, FWD

WINDOW = 20  # steps a verdict is over (the panel's window; 10 s at 0.5 s a step)
ALPHA = 0.01  # per-window false-alarm bound under no real difference (see the docstring)
MIN_EXCESS_MS = 5.0
MIN_EXCESS_REL = 0.10

PASS_NAMES = {FWD: "forward", BWD: "backward"}

Section = tuple[int, int]  # (FWD or BWD, layer)
Sections = dict[int, dict[Section, float]]  # rank -> section -> ms (one step)


def sections_of(b) -> dict[Section, float]:
    """One rank's span batch -> (pass, layer) -> ms (a section seen twice: summed)."""
    out: dict[Section, float] = {}
    kind, idx, t0, t1 = b.kind, b.idx, b.t0, b.t1
    for i in range(len(kind)):
        k = kind[i]
        if k == FWD or k == BWD:
            key = (k, idx[i])
            out[key] = out.get(key, 0.0) + (t1[i] - t0[i]) / 1000
    return out


def step_sections(batches: dict) -> Sections:
    """rank -> its sections, for one step's span batches (rank -> batch)."""
    return {r: sections_of(b) for r, b in batches.items()}


def step_excess(sections: Sections) -> tuple[dict[int, dict[Section, float]], dict[Section, float]]:
    """Per rank and section: own ms - the other ranks' median (sections on two or more
    ranks); and per section the median over all ranks (the reference)."""
    by_sec: dict[Section, list[tuple[int, float]]] = {}
    for r, secs in sections.items():
        for key, ms in secs.items():
            got = by_sec.get(key)
            if got is None:
                by_sec[key] = [(r, ms)]
            else:
                got.append((r, ms))
    excess: dict[int, dict[Section, float]] = {r: {} for r in sections}
    ref: dict[Section, float] = {}
    for key, got in by_sec.items():
        n = len(got)
        if n < 2:
            continue
        vals = sorted(ms for _, ms in got)
        ref[key] = vals[n // 2] if n % 2 else (vals[n // 2 - 1] + vals[n // 2]) / 2
        if n == 2:
            (ra, a), (rb, b) = got
            excess[ra][key], excess[rb][key] = a - b, b - a
            continue
        # the median of the others: which of three values depends only on where one's own
        # value sits (a duplicate taken out leaves the same list)
        j1, j2 = (n - 2) // 2, (n - 1) // 2  # the median's indices among n - 1 values
        lo, hi = vals[j1], vals[j2]
        if_above = (vals[j1] + vals[j2]) / 2  # own value after the median's: the first n - 1
        if_below = (vals[j1 + 1] + vals[j2 + 1]) / 2  # own value at or before it: the last n - 1
        if_mid = (vals[j1] + vals[j2 + 1]) / 2
        for r, ms in got:
            excess[r][key] = ms - (if_above if ms > hi else if_below if ms <= lo else if_mid)
    return excess, ref


@lru_cache(maxsize=4096)
def binom_tail(n: int, k: int) -> float:
    """P(Bin(n, 1/2) >= k)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return sum(comb(n, i) for i in range(k, n + 1)) / 2 ** n


@lru_cache(maxsize=4096)
def need_steps(steps: int, tests: int, alpha: float = ALPHA) -> int | None:
    """The fewest steps out of `steps` a rank must be slower in for `tests` one-sided sign
    tests to stay within `alpha` together; None: no count can (too few steps)."""
    for k in range(steps // 2 + 1, steps + 1):
        if tests * binom_tail(steps, k) <= alpha:
            return k
    return None


@dataclass
class Finding:
    """A rank slow in one section over a window."""
    rank: int
    section: Section
    excess_ms: float  # median over the window of own - the others' median
    mad_ms: float  # median absolute deviation of that excess
    ref_ms: float  # the section's median duration over ranks and steps
    slower: int  # steps of the window in which the rank was slower
    steps: int  # steps in the window
    p: float  # P(Bin(steps, 1/2) >= slower): the sign test's tail

    def text(self, layer_names: list[str]) -> str:
        return finding_text(self.rank, self.section, self.excess_ms, layer_names)


@dataclass
class Verdict:
    """One window's judgement."""
    first: int  # first and last step of the window
    last: int
    steps: int
    tests: int  # m: ranks x sections tested
    need: int | None  # steps a rank must be slower in (None: too few steps to judge)
    findings: list[Finding]  # every slow (rank, section), largest excess first
    excess_ms: dict[int, dict[Section, float]]  # per rank: median excess of each section

    @property
    def culprit(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    @property
    def bound(self) -> float | None:
        """The false-alarm bound of this window (m * P(Bin(W, 1/2) >= need))."""
        return None if self.need is None else self.tests * binom_tail(self.steps, self.need)


def section_name(section: Section, layer_names: list[str]) -> str:
    kind, layer = section
    name = layer_names[layer] if 0 <= layer < len(layer_names) else f"layer {layer}"
    return f"{name} {PASS_NAMES.get(kind, '?')}"


def finding_text(rank: int, section: Section, ms: float, layer_names: list[str]) -> str:
    """'rank 1 · fc2 backward +40 ms'."""
    v = f"{ms:+.0f}" if abs(ms) >= 1 else f"{ms:+.1f}"
    return f"rank {rank} · {section_name(section, layer_names)} {v} ms"


def _mad(vals: list[float], m: float) -> float:
    return median(abs(v - m) for v in vals)


def judge(window: list[tuple[int, dict[int, dict[Section, float]], dict[Section, float]]],
          alpha: float = ALPHA, min_ms: float = MIN_EXCESS_MS, min_rel: float = MIN_EXCESS_REL) -> Verdict:
    """A window of steps, each (step, excess per rank and section, reference per section)
    as `step_excess` gives them, oldest first -> who is slow in which section."""
    steps = len(window)
    first = window[0][0] if window else -1
    last = window[-1][0] if window else -1
    # a section counts where it was measured on every step of the window
    series: dict[tuple[int, Section], list[float]] = {}
    for _, exc, _ in window:
        for r, secs in exc.items():
            for key, v in secs.items():
                series.setdefault((r, key), []).append(v)
    series = {k: v for k, v in series.items() if len(v) == steps}
    tests = len(series)
    need = need_steps(steps, tests, alpha) if steps and tests else None
    findings: list[Finding] = []
    excess: dict[int, dict[Section, float]] = {}
    refs: dict[Section, float] = {}
    for (r, key), vals in series.items():
        m = median(vals)
        excess.setdefault(r, {})[key] = m
        if need is None:
            continue
        slower = sum(1 for v in vals if v > 0)
        if slower < need or m < min_ms:
            continue
        ref = refs.get(key)
        if ref is None:
            ref = refs[key] = median(w[2][key] for w in window if key in w[2])
        if m < min_rel * ref:
            continue
        findings.append(Finding(r, key, m, _mad(vals, m), ref, slower, steps, binom_tail(steps, slower)))
    findings.sort(key=lambda f: (-f.excess_ms, f.rank, f.section))
    return Verdict(first, last, steps, tests, need, findings, excess)


def windows(series: list, size: int = WINDOW, stride: int = 1):
    """Every full window of `size` consecutive entries of `series`, `stride` apart, the last
    one ending at the newest entry."""
    n = len(series)
    if n < size:
        return
    starts = list(range(n - size, -1, -stride))
    for a in reversed(starts):
        yield series[a:a + size]


def onset(values: list[float], level: float) -> int:
    """Where a step up by about `level` in `values` most likely happened (the index of the
    first value after it; 0: it was there from the first value): values clipped to
    [0, level] (a spike counts no more than the change), then the split that maximises the
    contrast of the means, (after - before) * sqrt(i * (n - i)) (one-change CUSUM), among
    the splits where after - before is at least level / 2."""
    x = [min(max(v, 0.0), level) for v in values]
    n = len(x)
    total = sum(x)
    best, at, acc = 0.0, 0, 0.0
    for i in range(1, n):
        acc += x[i - 1]
        a, b = acc / i, (total - acc) / (n - i)
        if b - a < level / 2:
            continue
        score = (b - a) * (i * (n - i)) ** 0.5
        if score > best:
            best, at = score, i
    return at


def scan(steps: list[tuple[int, int, dict, dict]], size: int = WINDOW, stride: int = 1,
         alpha: float = ALPHA) -> dict | None:
    """Sliding windows over steps (step, start ns, excess, reference), oldest first: the
    newest window's verdict, how many windows named anyone and the newest culprit, and when
    that culprit was first named (detection: the first window of the run of windows naming
    it that reaches the newest) against the change's estimated onset. None: fewer steps
    than a window."""
    if len(steps) < size:
        return None
    verdicts = [judge([(k, e, ref) for k, _, e, ref in w], alpha) for w in windows(steps, size, stride)]
    newest = verdicts[-1]
    named = sum(1 for v in verdicts if v.culprit)
    out = {"verdict": newest, "windows": len(verdicts), "windows_named": named,
           "windows_naming_culprit": 0, "detected_step": None, "onset_step": None,
           "detection_steps": None, "detection_s": None}
    c = newest.culprit
    if c is None:
        return out
    key = (c.rank, c.section)

    def names_it(v: Verdict) -> bool:
        return v.culprit is not None and (v.culprit.rank, v.culprit.section) == key
    out["windows_naming_culprit"] = sum(1 for v in verdicts if names_it(v))
    i = len(verdicts) - 1
    while i > 0 and names_it(verdicts[i - 1]):
        i -= 1
    detected = verdicts[i].last
    ks = [s[0] for s in steps]
    upto = ks.index(detected)
    series = [s[2].get(c.rank, {}).get(c.section, 0.0) for s in steps[:upto + 1]]
    on = onset(series, c.excess_ms)
    t_of = {s[0]: s[1] for s in steps}
    out.update(detected_step=detected, onset_step=ks[on], detection_steps=detected - ks[on],
               detection_s=round((t_of[detected] - t_of[ks[on]]) / 1e9, 3))
    return out
