"""Jobs run one at a time, in the order asked, on a worker thread of a Textual app: the
replay's transport (play, step, seek, speed) can take long on a big recording and must never
hold up the event loop, nor two of them race each other."""
from __future__ import annotations

from collections import deque
from typing import Callable


class JobQueue:
    """`put(job)` queues a job; a worker thread of `app` runs the queue dry, then `done` runs
    on the event loop. `busy` is true from the first job put until `done`."""

    def __init__(self, app, done: Callable[[], None], name: str = "jobs"):
        self.app, self.done, self.name = app, done, name
        self.busy = False
        self._jobs: deque = deque()

    def put(self, job: Callable[[], object]) -> None:
        self._jobs.append(job)
        if not self.busy:
            self.busy = True
            self._start()

    def _start(self) -> None:
        self.app.run_worker(self._run, thread=True, name=self.name, exit_on_error=False)

    def _run(self) -> None:
        try:
            while self._jobs:
                self._jobs.popleft()()
        finally:
            self.app.call_from_thread(self._drained)

    def _drained(self) -> None:
        if self._jobs:  # put while the worker was finishing
            self._start()
            return
        self.busy = False
        self.done()
