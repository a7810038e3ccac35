"""What is in force at a step: the one reader of the Store's step-ordered histories (bucket
assignments, bucket_cap_mb changes), shared by its figures, its queries and the trace export."""
from __future__ import annotations


def in_force(entries, step: int, default=None, first: bool = False):
    """The value of the last (k, value, ...) entry with k <= step (entries in step order):
    what is in force at `step`. None there: `default`, or the first entry's with first=True."""
    got = default
    if first and entries:
        got = entries[0][1]
    for e in entries:
        if e[0] > step:
            break
        got = e[1]
    return got


def in_force_span(entries, step: int) -> tuple[int, int, int]:
    """(the index of the entry in force at `step` as in_force(..., first=True) reads it, and
    the steps [lo, hi) over which that same entry is the one in force): a reader may keep
    what it made from the entry while a step falls in that span and no entry was added."""
    i = 0
    for j, e in enumerate(entries):
        if e[0] > step:
            break
        i = j
    lo = entries[i][0] if i else -(1 << 62)  # (the first entry is in force before it too)
    hi = entries[i + 1][0] if i + 1 < len(entries) else 1 << 62
    return i, lo, hi
