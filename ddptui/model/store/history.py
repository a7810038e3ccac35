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
