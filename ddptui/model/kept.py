"""A few results kept by the identity of what they were made from.

Span batches, StepWaits and step views never change once made, so a result made from the
same objects is the same result: the panel, the status line, the headline and the lanes ask
for the same summary every frame, and the Updater's thread makes it first. Safe from two
threads (two may make the same result at once; either is kept); the oldest goes first.
"""
from __future__ import annotations

import threading
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


class Kept:
    __slots__ = ("size", "_items", "_lock")

    def __init__(self, size: int = 16):
        self.size = size
        self._items: dict = {}
        self._lock = threading.Lock()

    def get(self, key, sources: Sequence, make: Callable[[], T]) -> T:
        """The result kept under `key` if it was made from these very `sources` (the same
        objects, in order), else make() kept. Holding the sources keeps their ids unique."""
        with self._lock:
            hit = self._items.get(key)
        if hit is not None and len(hit[0]) == len(sources) and all(a is b for a, b in zip(hit[0], sources)):
            return hit[1]
        value = make()
        with self._lock:
            if key not in self._items and len(self._items) >= self.size:
                self._items.pop(next(iter(self._items)))
            self._items[key] = (tuple(sources), value)
        return value
