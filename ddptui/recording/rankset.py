"""A run recorded as one file per rank (ddptui.instrument without the app, under any
launcher): a directory of ``rank<r>.ddptui`` files read as one recording.

`open_reader(DIR)` is a RankSetReader, so every verb that reads a recording (summary,
replay, export, serve) takes the directory. Each file is a complete recording of one rank
(its header: the run's world, layers, parameters); their frames are merged in step order
(the smallest step first), which is what a live run's collector would have seen, give or
take interleaving within a step.
"""
from __future__ import annotations

import os
import re

from ranks import frames
from ranks.recfile import RecordingError

from .reader import Reader

_RANK_FILE = re.compile(r"rank(\d+)\.ddptui$")


def rank_files(path: str) -> list[str]:
    """The per-rank recordings in a directory, by rank; RecordingError when there are none."""
    try:
        names = os.listdir(path)
    except OSError as e:
        raise RecordingError(f"{path}: cannot list ({e.strerror})") from None
    found = sorted((int(m.group(1)), n) for n in names if (m := _RANK_FILE.fullmatch(n)))
    if not found:
        raise RecordingError(f"{path}: a directory without per-rank recordings (rank<N>.ddptui), "
                              f"PyTorch Flight Recorder dumps (<prefix><rank>) or torch.profiler "
                              f"traces (*.json, *.json.gz)")
    return [os.path.join(path, n) for _, n in found]


class RankSetReader(Reader):
    """Reads every rank's file of a directory as one recording (same interface as Reader)."""

    def __init__(self, path: str, chunk: int = 1 << 20):
        self.path = path
        self.name = os.path.basename(os.path.normpath(path))
        self.damage = None
        self.frames = 0
        self.readers: list[Reader] = []
        try:
            for f in rank_files(path):
                self.readers.append(Reader(f, chunk))
        except BaseException:
            self.close()
            raise
        self.meta = self._merge_meta([r.meta for r in self.readers])

    @staticmethod
    def _merge_meta(metas: list[dict]) -> dict:
        meta = dict(metas[0])
        devices: dict = {}
        for m in metas:
            devices.update(m.get("devices") or {})
        meta["devices"] = devices
        meta["world"] = max([m.get("world") or 1 for m in metas] + [len(metas)])
        return meta

    def __iter__(self):
        its = [iter(r) for r in self.readers]
        heads: list = [None] * len(its)
        keys = [-1] * len(its)
        for i, it in enumerate(its):
            heads[i] = next(it, None)
        while True:
            live = [i for i, h in enumerate(heads) if h is not None]
            if not live:
                break
            for i in live:  # a frame's place: its step (spans), else its file's last step
                f = heads[i][1]
                if type(f) is frames.Spans:
                    keys[i] = f.step
            i = min(live, key=lambda j: (keys[j] if type(heads[j][1]) is frames.Spans else -1, j))
            self.frames += 1
            yield heads[i]
            heads[i] = next(its[i], None)
        bad = [f"{os.path.basename(r.path)}: {r.damage}" for r in self.readers if r.damage]
        self.damage = "; ".join(bad) if bad else None

    def close(self) -> None:
        for r in self.readers:
            r.close()


def open_reader(path: str, chunk: int = 1 << 20) -> Reader:
    """The reader of a recording: a file's Reader, a directory of per-rank files as one, or a
    directory of PyTorch Flight Recorder dumps (recording/frdump.py) or of torch.profiler
    traces (recording/kineto.py)."""
    if isinstance(path, str) and os.path.isdir(path):
        if not any(_RANK_FILE.fullmatch(n) for n in os.listdir(path)):
            from .frdump import FrDumpReader, dump_files
            if dump_files(path) is not None:
                return FrDumpReader(path)  # type: ignore[return-value]  # one dump per rank
            from .kineto import KinetoReader, trace_files
            if trace_files(path):
                return KinetoReader(path)  # type: ignore[return-value]  # torch.profiler traces, one per rank
        return RankSetReader(path, chunk)
    return Reader(path, chunk)
