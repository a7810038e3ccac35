"""The UI's job queue (replay transport): jobs run one at a time, in order, off the event
loop, and the app hears once when the queue has drained, even for jobs put while it drains."""
from __future__ import annotations

import asyncio
import threading

import pytest
from textual.app import App

from ddptui.ui.jobs import JobQueue


@pytest.mark.asyncio
async def test_jobs_run_in_order_one_at_a_time_off_the_event_loop():
    app = App()
    async with app.run_test():
        loop_thread = threading.get_ident()
        ran, running, overlap, threads = [], [0], [], set()
        done = []
        gate = threading.Event()
        q = JobQueue(app, lambda: done.append((list(ran), q.busy)))

        def job(i):
            def run():
                running[0] += 1
                overlap.append(running[0] > 1)
                threads.add(threading.get_ident())
                if i == 0:
                    gate.wait(5)  # a slow first job: the others queue behind it
                ran.append(i)
                running[0] -= 1
            return run

        for i in range(4):
            q.put(job(i))
        assert q.busy
        await asyncio.sleep(0.1)
        assert ran == [] and not done  # the event loop went on while job 0 held the worker
        gate.set()
        for _ in range(100):
            if done:
                break
            await asyncio.sleep(0.02)
        assert ran == [0, 1, 2, 3] and not any(overlap)
        assert loop_thread not in threads
        assert done == [([0, 1, 2, 3], False)]  # once, after the last, no longer busy
        q.put(job(4))  # the queue starts again
        for _ in range(100):
            if len(done) == 2:
                break
            await asyncio.sleep(0.02)
        assert ran == [0, 1, 2, 3, 4] and len(done) == 2
