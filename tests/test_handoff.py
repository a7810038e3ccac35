"""The frame sinks' queue (ranks.core.emitter.Handoff): the training thread's put_nowait never wakes
the consumer (queue.Queue's wakes it every step: a futex call, and a thread that then wants
the GIL while the step goes on); what must arrive, a backlog, or the end wake it at once;
nothing is lost or reordered, and a full queue drops and counts."""
from __future__ import annotations

import queue
import threading
import time

import pytest

from ranks.core.emitter import FrameQueue, Handoff


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
    t = threading.Thread(target=lambda: [got.append(q.get()) for _ in range(3)], daemon=True)
    t.start()
    time.sleep(0.02)  # the consumer waits
    for i in range(3):
        q.put_nowait(i)
    assert q.wakes == 0  # (queue.Queue: 3)
    t.join(2.0)
    assert got == [0, 1, 2]  # taken at its next look (WAKE_S .. IDLE_S)


def _consumer(q, got):
    def consume():
        while (item := q.get()) is not None:
            got.append(item)
        got.append("end")
    t = threading.Thread(target=consume, daemon=True)
    t.start()
    time.sleep(0.02)  # it waits
    return t


def _slow(maxsize=64):
    q = CountingHandoff(maxsize)
    q.WAKE_S = q.IDLE_S = 5.0  # it would otherwise look only every 5 s
    return q


def _arrives(got, n, within=1.0):
    deadline = time.monotonic() + within
    while len(got) < n and time.monotonic() < deadline:
        time.sleep(0.002)
    return len(got) >= n


def test_what_must_arrive_wakes_it_at_once():
    q, got = _slow(), []
    _consumer(q, got)
    q.put("hello")  # send_now's path
    assert _arrives(got, 1) and got == ["hello"]


def test_a_backlog_wakes_it_at_once():
    q, got = _slow(), []
    _consumer(q, got)
    for i in range(Handoff.BATCH):
        q.put_nowait(i)
    assert _arrives(got, Handoff.BATCH) and got == list(range(Handoff.BATCH))


def test_the_end_wakes_it_at_once():
    q, got = _slow(), []
    t = _consumer(q, got)
    q.put_nowait("last step")
    q.put_nowait(None)
    t.join(1.0)
    assert not t.is_alive() and got == ["last step", "end"]


@pytest.mark.parametrize("maxsize", [2, 4, 7, 64])
def test_a_small_queue_wakes_its_consumer_before_it_fills(maxsize):
    """--queue-size under BATCH: the consumer is woken by the time the queue is half full
    (at BATCH items in a larger one), not left to its next look while steps are dropped."""
    q = CountingHandoff(maxsize)
    n = 0
    while q.wakes == 0:
        q.put_nowait(n)
        n += 1
    assert n == min(Handoff.BATCH, max(1, maxsize // 2)) and n < maxsize


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
