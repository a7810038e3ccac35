"""Where a rank's Python is: its threads' stacks as `faulthandler` writes them (the debug
server's ``dump_traceback`` handler), read.

    Current thread 0x00007f56adffb6c0 (most recent call first):
      <no Python frame>

    Thread 0x00007f56d59e2b80 (most recent call first):
      File "/job/train.py", line 11 in stall_here
      File "/job/train.py", line 21 in <module>

`parse(text)` gives each thread's frames, innermost first (of a deeper stack, the innermost
and the outermost: the job's own line below a deep import). The "current thread" is the debug
server's own (it has no Python frame). `main_stack` picks the training thread: the one whose
outermost frame is a script's ``<module>`` (the main thread's; several: the deepest), else
the deepest stack that is not the server's. `where(stack)` is the innermost frame, the line
the thread is on (in C code such as `time.sleep` or a collective's wait, the Python line that
called it); `own_frame(stack)` the innermost frame of the job's own code (not under
site-packages or the standard library), when it is not the innermost. Pure: text in.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_THREAD = re.compile(r"(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'\s*File "(.*)", line (\d+) in (.*)')
MAX_FRAMES = 64  # frames kept per thread (faulthandler itself writes at most 100)
OUTER_FRAMES = 16  # of them, the outermost (the job's own calls: a deep import keeps its caller)
LIBRARY = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ")


@dataclass(frozen=True)
class PyFrame:
    file: str
    line: int
    func: str

    @property
    def base(self) -> str:
        return self.file.rsplit("/", 1)[-1]

    def short(self) -> str:
        """'train.py:11 in stall_here'."""
        return f"{self.base}:{self.line} in {self.func}"

    def full(self) -> str:
        """'/job/train.py:11 in stall_here'."""
        return f"{self.file}:{self.line} in {self.func}"


@dataclass
class Stack:
    thread: str  # '0x00007f56d59e2b80'
    current: bool  # faulthandler's "Current thread": the one that wrote the dump
    frames: list[PyFrame] = field(default_factory=list)  # innermost first


def parse(text: str) -> list[Stack]:
    """Every thread's stack in faulthandler's text (module docstring); [] when none reads."""
    out: list[Stack] = []
    for line in text.splitlines():
        m = _THREAD.match(line.strip())
        if m:
            out.append(Stack(m.group(2), m.group(1) == "Current thread"))
            continue
        f = _FRAME.fullmatch(line)
        if f and out:
            fr = out[-1].frames
            fr.append(PyFrame(f.group(1), int(f.group(2)), f.group(3).strip()))
            if len(fr) > MAX_FRAMES:  # (the innermost and the outermost kept: drop one between them)
                del fr[MAX_FRAMES - OUTER_FRAMES]
    return out


def main_stack(stacks: list[Stack]) -> Stack | None:
    """The training thread's stack (module docstring), or None when no thread has a frame."""
    have = [s for s in stacks if s.frames]
    mains = [s for s in have if s.frames[-1].func == "<module>"]
    pick = mains or [s for s in have if not s.current] or have
    return max(pick, key=lambda s: len(s.frames)) if pick else None


def where(stack: Stack) -> PyFrame:
    """The line the thread is on: its innermost frame (an import's `<frozen importlib...>`
    frames skipped: the module being imported is the line)."""
    return next((f for f in stack.frames if not f.file.startswith("<frozen ")), stack.frames[0])


def own_frame(stack: Stack) -> PyFrame | None:
    """The innermost frame of the job's own code, when the thread is inside a library (torch,
    the standard library) at its innermost; None when it is in its own code there, or never."""
    for i, f in enumerate(stack.frames):
        if not any(x in f.file for x in LIBRARY):
            return f if i else None
    return None


def describe(stack: Stack | None) -> str:
    """'train.py:11 in stall_here', or 'torch/autograd/graph.py:979 in _engine_run_backward
    (called from train.py:16 in <module>)'; '' without a stack."""
    if stack is None or not stack.frames:
        return ""
    top = where(stack)
    own = own_frame(stack)
    text = top.short() if own is None else f"{_lib(top.file)}:{top.line} in {top.func}"
    return text + (f" (called from {own.short()})" if own is not None else "")


def _lib(path: str) -> str:
    """A library file's path from its package on: 'torch/autograd/graph.py'."""
    for mark in ("/site-packages/", "/dist-packages/"):
        if mark in path:
            return path.split(mark, 1)[1]
    return path.rsplit("/", 1)[-1]
