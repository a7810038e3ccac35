"""The frame sinks' queue (ranks.emitter.Handoff): the training thread's put_nowait never wakes
the consumer (queue.Queue's wakes it every step: a futex call, and a thread that then wants
the GIL while the step goes on); what must arrive, a backlog, or the end wake it at once;
nothing is lost or reordered, and a full queue drops and counts."""
from __future__ import annotations

import queue
import threading
import time

from ranks.emitter import FrameQueue, Handoff


class CountingHandoff(Handoff):
    def __init__(self, maxsize):
        super().__init__(maxsize)
        self.wakes = 0

    def _wake(self):
        self.wakes += 1
        super()._wake()


def test_a_step_put_does_not_wake_the_consumer_but_it_takes_it_soon():
    q = CountingHandoff(64)
    got = []
    t = threading.Thread(target=lambda: [got.append(q.get()) for _ in range(3)])
    t.start()
    time.sleep(0.02)  # the consumer waits
    for i in range(3):
        q.put_nowait(i)
    assert q.wakes == 0  # (queue.Queue: 3)
    t.join(2.0)
    assert got == [0, 1, 2]  # taken at its next look (WAKE_S .. IDLE_S)


def test_what_must_arrive_a_backlog_and_the_end_wake_it_at_once():
    q = CountingHandoff(64)
    q.WAKE_S = q.IDLE_S = 5.0  # it would otherwise look only every 5 s
    got = []

    def consume():
        while (item := q.get()) is not None:
            got.append((item, time.monotonic()))

    t = threading.Thread(target=consume)
    t.start()
    time.sleep(0.02)
    t0 = time.monotonic()
    q.put("hello")  # send_now's path
    for i in range(Handoff.BATCH):
        q.put_nowait(i)
    q.put_nowait(None)  # the end
    t.join(2.0)
    assert not t.is_alive() and time.monotonic() - t0 < 1.0
    assert [g for g, _ in got] == ["hello", *range(Handoff.BATCH)]


def test_a_full_queue_drops_and_counts_the_steps_spans():
    fq = FrameQueue(2)

    class Step:
        n_spans = 7

        def __call__(self):
            return None

    assert fq.put(Step()) and fq.put(Step())
    assert not fq.put(Step())  # full: dropped, never blocks
    assert (fq.dropped_frames, fq.dropped_spans) == (1, 7)
    try:
        fq.q.put("bye", timeout=0.05)
    except queue.Full:
        pass
    else:
        raise AssertionError("put waits while full, then raises queue.Full")
    assert fq.q.get_nowait() is not None and fq.q.qsize() == 1
