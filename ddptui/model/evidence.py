"""Who is slow, from per-layer evidence: each rank's forward and backward of each layer
against the other ranks', judged over a window of steps.

Arrival order (ddptui/model/stragglers.py) says whom the others waited for; when ranks share busy
cores it is noisy (either rank is now and then tens of ms late). A rank whose layer is slow
is slow in every step, so the evidence here is per section (a layer's forward or backward).

Time taken from a rank by something else (another process on its core, the app, a gloo
thread) only ever adds to a section; a slow layer adds its delay to every step. Over a window
of W steps (default 20), rank r is slow in a section when all of these hold:

1. **fast steps**: r's FAST_QUANTILE (10 %) of its durations, the cost in its fast steps (the
   3rd fastest of 20), exceeds the median of the other ranks' by MIN_EXCESS_MS: slower even
   when nothing else took its time (also what keeps the work below cheap at 1,024 ranks);
2. **consistency**: r was slower than the others' median in at least MIN_SLOWER (60 %) of the
   window's steps: one lucky stretch of the others does not make r slow;
3. **size**: the shift between r's durations and the others' median's over the window, the
   Hodges-Lehmann estimate (the median of all W x W differences: a few preempted steps on
   either side do not move it), is at least MIN_EXCESS_MS and MIN_EXCESS_REL (20 %) of the
   others' median duration: a difference that matters (a rank sharing its core with the app
   is a few per cent slower in every step). That shift is the excess named.

The false-alarm rate is measured, not bounded: benchmark P10 runs 2 CPU ranks sharing 2 cores
(the noisiest setting this tool meets) without a delay and counts the windows that name
anyone (benchmarks/README.md has the figures). A sign test with a bound (slower in 18
of 20 steps) missed a real 40 ms in 30-40 % of windows there: the others' own preemptions
(up to 80 ms) make the slow rank the faster one in a step out of ten.

The window's spread is the median absolute deviation (MAD) of the step-by-step excess. The
culprit is the slow (rank, section) with the largest excess: "rank 1 · fc2 backward +40 ms".
Pure functions over `Sections` (rank -> (pass, layer) -> ms of one step); the Store keeps
one per step with who waited for whom (`StepWaits.sections`).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from math import comb
from statistics import median

from ranks.wire import BWD, FWD

from .columns import placement

WINDOW = 20  # steps a verdict is over (the panel's window; 10 s at 0.5 s a step)
FAST_QUANTILE = 0.10  # a section's cost on a rank: this quantile of its window (the fast steps)
MIN_EXCESS_MS = 5.0
MIN_EXCESS_REL = 0.20  # of the other ranks' median duration
MIN_SLOWER = 0.60  # of the window's steps

PASS_NAMES = {FWD: "forward", BWD: "backward"}

Section = tuple[int, int]  # (FWD or BWD, layer)
Sections = dict[int, dict[Section, float]]  # rank -> section -> ms (one step)


def sections_of(b) -> dict[Section, float]:
    """One rank's span batch -> (pass, layer) -> ms (a section seen twice: summed)."""
    kind, idx, t0, t1 = b.kind, b.idx, b.t0, b.t1
    place = placement(b)
    if place.sections is not None:  # each section once (the rule): column-wise
        return dict(zip(place.sections, [(t1[i] - t0[i]) / 1000 for i in place.layered]))
    out: dict[Section, float] = {}
    for i in range(len(kind)):
        k = kind[i]
        if k == FWD or k == BWD:
            key = (k, idx[i])
            out[key] = out.get(key, 0.0) + (t1[i] - t0[i]) / 1000
    return out


Flat = tuple[tuple[tuple[int, Section], ...], tuple[float, ...]]  # ((rank, section) ..., ms ...)
_last_keys: list = [((), ())]  # (ranks and their sections, keys) of the last flattened step


def flatten(sections: Sections) -> Flat:
    """One step's sections as a key column and a value column, ranks and sections in order:
    a window of steps with the same keys is turned column-wise by zip, in C (and, made from
    the same ranks and sections as the step before, the keys are that step's very object)."""
    ranks = sorted(sections)
    order = [tuple(sorted(sections[r])) for r in ranks]
    shape = (tuple(ranks), tuple(order))
    last_shape, keys = _last_keys[0]
    if shape != last_shape:
        keys = tuple((r, key) for r, secs in zip(ranks, order) for key in secs)
        _last_keys[0] = (shape, keys)
    return keys, tuple(ms for r, secs in zip(ranks, order) for ms in map(sections[r].__getitem__, secs))


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
    return _excess(by_sec, sections)


def _excess(by_sec: dict[Section, list[tuple[int, float]]], ranks) -> tuple[dict[int, dict[Section, float]], dict[Section, float]]:
    """step_excess of the sections gathered by section: (rank, ms) of each rank that has it."""
    excess: dict[int, dict[Section, float]] = {r: {} for r in ranks}
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


def need_steps(steps: int, min_slower: float = MIN_SLOWER) -> int:
    """The fewest steps out of `steps` a rank must be slower in (consistency)."""
    return max(1, -int(-min_slower * steps // 1))


def shift(mine: list[float], others: list[float]) -> float:
    """The Hodges-Lehmann shift of `mine` over `others`: the median of all pairwise differences."""
    return median([a - b for a in mine for b in others])


def fast_index(n: int, q: float = FAST_QUANTILE) -> int:
    """Where the q-quantile (the nearest rank) sits among n sorted values."""
    return min(n - 1, int(q * (n - 1) + 0.5))


def fast_time(vals: list[float], q: float = FAST_QUANTILE) -> float:
    """The q-quantile of vals (the nearest rank): a section's cost in a rank's fast steps."""
    s = sorted(vals)
    return s[fast_index(len(s), q)]


@dataclass
class Finding:
    """A rank slow in one section over a window."""
    rank: int
    section: Section
    excess_ms: float  # the shift of own durations over the others' median's (Hodges-Lehmann)
    mad_ms: float  # median absolute deviation of the step-by-step excess
    ref_ms: float  # the others' median duration over the window
    fast_excess_ms: float  # own fast time - the median of the other ranks' fast times
    slower: int  # steps of the window in which the rank was slower than the others' median
    steps: int  # steps in the window
    p: float  # P(Bin(steps, 1/2) >= slower): how unlikely that count is by chance alone

    def text(self, layer_names: list[str]) -> str:
        return finding_text(self.rank, self.section, self.excess_ms, layer_names)


@dataclass
class Verdict:
    """One window's judgement."""
    first: int  # first and last step of the window
    last: int
    steps: int
    tests: int  # ranks x sections judged
    need: int  # steps a rank must be slower in
    findings: list[Finding]  # every slow (rank, section), largest excess first
    # per rank: the excess of each section in its fast steps (a read-only Mapping, made rank by
    # rank when asked for, where the window was judged column-wise)
    excess_ms: Mapping[int, dict[Section, float]]

    @property
    def culprit(self) -> Finding | None:
        return self.findings[0] if self.findings else None


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


Step = tuple[int, Flat, dict[int, dict[Section, float]]]  # (step, its flattened sections, step_excess's excess)
COLUMNWISE_FROM = 2048  # (rank, section) columns from which a window is judged with numpy


def judge(window: list[Step], min_ms: float = MIN_EXCESS_MS, min_rel: float = MIN_EXCESS_REL,
          min_slower: float = MIN_SLOWER) -> Verdict:
    """A window of steps, each (step, its sections flattened, excess per rank and section as
    `step_excess` gives it), oldest first -> who is slow in which section."""
    steps = len(window)
    first = window[0][0] if window else -1
    last = window[-1][0] if window else -1
    flats = [f for _, f, _ in window]
    keys = flats[0][0] if flats else ()
    at = fast_index(steps)
    need = need_steps(steps, min_slower)
    same = all(f[0] is keys or f[0] == keys for f in flats)
    if same and steps and len(keys) >= COLUMNWISE_FROM:
        grid = _grid(keys)
        if grid is not None:  # many ranks, every one with the same sections: column-wise
            excess, cols = _fast_excess(flats, at, *grid)
            cands = excess.candidates(min_ms)
            findings = _findings(window, cands, cols, steps, need, min_ms, min_rel)
            return Verdict(first, last, steps, len(keys) if len(grid[0]) >= 2 else 0, need, findings, excess)
    if same:  # the same sections every step
        cols = dict(zip(keys, zip(*(f[1] for f in flats))))
    else:  # a section counts where it was measured on every step of the window
        per: dict = {}
        for ks, vs in flats:
            for k, v in zip(ks, vs):
                per.setdefault(k, []).append(v)
        cols = {k: v for k, v in per.items() if len(v) == steps}
    # each column's fast time (fast_time of its `steps` values), made in one pass: at 64 ranks
    # a window has over a thousand columns, judged at every new step
    by_sec: dict[Section, list[tuple[int, float]]] = {}
    ranks: dict[int, None] = {}
    for (r, key), s in zip(cols, map(sorted, cols.values())):
        ranks[r] = None
        got = by_sec.get(key)
        if got is None:
            by_sec[key] = [(r, s[at])]
        else:
            got.append((r, s[at]))
    excess, _ = _excess(by_sec, ranks)
    tests = sum(len(v) for v in excess.values())
    cands = [(r, key, fast_ex) for r, got in excess.items() for key, fast_ex in got.items() if fast_ex >= min_ms]
    return Verdict(first, last, steps, tests, need, _findings(window, cands, cols, steps, need, min_ms, min_rel),
                   excess)


def _findings(window: list[Step], cands, cols, steps: int, need: int, min_ms: float,
              min_rel: float) -> list[Finding]:
    """The (rank, section, fast excess) candidates that hold over the window, largest excess
    first; cols[(rank, section)]: that column's values over the window."""
    findings: list[Finding] = []
    for r, key, fast_ex in cands:
        series = [e[r][key] for _, _, e in window if key in e.get(r, {})]
        slower = sum(1 for v in series if v > 0)
        if slower < need or len(series) != steps:
            continue
        mine = cols[(r, key)]
        others = [d - e for d, e in zip(mine, series)]  # the others' median, step by step
        ex, ref = shift(mine, others), median(others)
        if ex < min_ms or ex < min_rel * ref:
            continue
        findings.append(Finding(r, key, ex, _mad(series, median(series)), ref, fast_ex, slower, steps,
                                binom_tail(steps, slower)))
    findings.sort(key=lambda f: (-f.excess_ms, f.rank, f.section))
    return findings


_GRIDS: dict = {}  # keys (by identity, the same object while the shape holds) -> (ranks, sections)


def _grid(keys) -> tuple[list[int], list[Section]] | None:
    """(ranks, sections) where `keys` are every rank's same sections, rank by rank (as flatten
    and columnwise.sections_excess make them), else None."""
    got = _GRIDS.get(id(keys))
    if got is not None and got[0] is keys:
        return got[1]
    ranks = list(dict.fromkeys(r for r, _ in keys))
    n_s = len(keys) // len(ranks) if ranks else 0
    secs = [k for _, k in keys[:n_s]]
    grid = (ranks, secs) if n_s and len(keys) == len(ranks) * n_s and \
        keys == tuple((r, k) for r in ranks for k in secs) else None
    if len(_GRIDS) > 16:
        _GRIDS.clear()
    _GRIDS[id(keys)] = (keys, grid)
    return grid


class _Columns:
    """cols[(rank, section)] -> that column's values over the window (a steps x columns
    matrix: only the few columns a finding needs are ever taken out)."""

    __slots__ = ("ranks", "secs", "m")

    def __init__(self, ranks: dict, secs: dict, m):
        self.ranks, self.secs, self.m = ranks, secs, m

    def __getitem__(self, key):
        r, sec = key
        return tuple(self.m[:, self.ranks[r] * len(self.secs) + self.secs[sec]].tolist())


class RankExcess(Mapping):
    """rank -> {section: own time - the other ranks' median} (a step's excess, and a window's
    fast times' in Verdict.excess_ms), from a ranks x sections matrix: a rank's dict made when
    asked for (at 1,024 ranks, few are)."""

    def __init__(self, ranks: list[int], secs: list[Section], ex):
        self._ranks, self._secs, self._ex = ranks, secs, ex
        self._at = {r: i for i, r in enumerate(ranks)}

    def __getitem__(self, r):
        return dict(zip(self._secs, self._ex[self._at[r]].tolist()))

    def __iter__(self):
        return iter(self._ranks)

    def __len__(self):
        return len(self._ranks)

    def candidates(self, min_ms: float) -> list[tuple[int, Section, float]]:
        """(rank, section, excess) where the excess is at least min_ms, rank by rank."""
        import numpy as np
        return [(self._ranks[i], self._secs[j], float(self._ex[i, j]))
                for i, j in np.argwhere(self._ex >= min_ms).tolist()]


def over_median(x):
    """Column-wise step_excess: for a ranks x sections array (two ranks or more), each value
    less the other ranks' median of its column, and each column's median over all ranks —
    the same sorts, sums and halves as rank by rank (the same values)."""
    import numpy as np
    n = len(x)
    v = np.sort(x, axis=0)
    med = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
    if n == 2:
        return np.vstack([x[0] - x[1], x[1] - x[0]]), med
    j1, j2 = (n - 2) // 2, (n - 1) // 2
    lo, hi = v[j1], v[j2]
    if_above, if_below, if_mid = (v[j1] + v[j2]) / 2, (v[j1 + 1] + v[j2 + 1]) / 2, (v[j1] + v[j2 + 1]) / 2
    return x - np.where(x > hi, if_above, np.where(x <= lo, if_below, if_mid)), med


def _fast_excess(flats: list, at: int, ranks: list[int], secs: list[Section]):
    """judge's fast times and their excess over the other ranks' median, column-wise: the
    same values as the rank-by-rank way (the same sort, the same sums and halves)."""
    import numpy as np
    m = np.array([f[1] for f in flats], dtype=np.float64)  # steps x (rank, section)
    n, n_s = len(ranks), len(secs)
    fast = np.sort(m, axis=0)[at].reshape(n, n_s)  # ranks x sections
    cols = _Columns({r: i for i, r in enumerate(ranks)}, {k: j for j, k in enumerate(secs)}, m)
    if n < 2:
        return RankExcess(ranks, [], np.empty((n, 0))), cols
    return RankExcess(ranks, secs, over_median(fast)[0]), cols


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


def scan(steps: list[tuple[int, int, Flat, dict]], size: int = WINDOW, stride: int = 1) -> dict | None:
    """Sliding windows over steps (step, start ns, flattened sections, excess), oldest first: the
    newest window's verdict, how many windows named anyone and the newest culprit, and when
    that culprit was first named (detection: the first window of the run of windows naming
    it that reaches the newest) against the change's estimated onset. None: fewer steps
    than a window."""
    if len(steps) < size:
        return None
    verdicts = [judge([(k, secs, e) for k, _, secs, e in w]) for w in windows(steps, size, stride)]
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
    series = [s[3].get(c.rank, {}).get(c.section, 0.0) for s in steps[:upto + 1]]
    on = onset(series, c.excess_ms)
    t_of = {s[0]: s[1] for s in steps}
    out.update(detected_step=detected, onset_step=ks[on], detection_steps=detected - ks[on],
               detection_s=round((t_of[detected] - t_of[ks[on]]) / 1e9, 3))
    return out
