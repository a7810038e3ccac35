"""Rank -> ddptui: batched, length-prefixed msgpack frames over a Unix socket.

Training never waits for the app: put() hands a frame to a bounded queue and returns; a
background thread encodes and sends. When the queue is full the frame is dropped and its
spans are counted. A second thread reads control messages (stop, set) from the app, and if
the socket closes the worker exits by itself.
"""
from __future__ import annotations

import os
import queue
import socket
import sys
import threading
import time
from collections import deque

from ranks import frames, seams, wire
from ranks.clock import now_ns

EXIT_APP_GONE = 3


class Handoff:
    """A bounded queue from the training thread to one consumer thread whose `put_nowait` (a
    step's spans, every step) does not wake the consumer: a deque append, no lock.
    queue.Queue's takes a lock and wakes a waiting consumer each time (a futex call, and the
    consumer then wants the GIL while the step goes on). The consumer takes what is there
    when a backlog of BATCH items, `put` (frames that must arrive) or the end (None) wakes it,
    or else every WAKE_S (doubling to IDLE_S while nothing comes). queue.Queue's interface, as
    the sinks use it."""

    WAKE_S = 0.005
    IDLE_S = 0.05
    BATCH = 8

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._wake_at = max(1, min(self.BATCH, maxsize // 2))  # (a small queue: before it fills)
        self._d: deque = deque()
        self._cv = threading.Condition(threading.Lock())

    def qsize(self) -> int:
        return len(self._d)

    def empty(self) -> bool:
        return not self._d

    def full(self) -> bool:
        return len(self._d) >= self.maxsize

    def put_nowait(self, item) -> None:
        d = self._d
        if len(d) >= self.maxsize:
            raise queue.Full
        d.append(item)
        if item is None or len(d) >= self._wake_at:
            self._wake()

    def put(self, item, timeout: float | None = None) -> None:
        """Waits while full (up to `timeout`, then queue.Full), and wakes the consumer."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(self._d) >= self.maxsize:
            if deadline is not None and time.monotonic() >= deadline:
                raise queue.Full
            time.sleep(0.001)
        self._d.append(item)
        self._wake()

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify()

    def get(self):
        d, wait = self._d, self.WAKE_S
        while True:
            try:
                return d.popleft()
            except IndexError:
                pass
            with self._cv:  # (an urgent put appends, then notifies under the lock: not missed)
                if not d:
                    self._cv.wait(wait)
                    wait = min(wait * 2, self.IDLE_S)

    def get_nowait(self):
        try:
            return self._d.popleft()
        except IndexError:
            raise queue.Empty from None


class FrameQueue:
    """The training thread's side of a frame sink: a bounded queue that never blocks training
    (put drops and counts) except for the frames that must arrive (send_now waits a little)."""

    def __init__(self, maxsize: int):
        self.q = Handoff(maxsize)
        self.dropped_spans = 0
        self.dropped_frames = 0
        # () -> (the collective this rank is inside, as frames.Inflight, or None; collectives
        # entered so far[; the DDP bucket it is the AllReduce of, or None]): the heartbeat says
        # it (a hang names the collective); None: not known
        self.collectives = None

    def put(self, frame, n_spans: int | None = None) -> bool:
        """Queue a frame (a ranks.frames Struct, a span-batch tuple from Recorder.poll, or a
        callable that returns one: resolved and encoded off the training thread). A dropped
        frame's spans are counted: `n_spans`, else the frame's own `n_spans` (a step's)."""
        try:
            self.q.put_nowait(frame)
            return True
        except queue.Full:
            self.dropped_frames += 1
            if n_spans is None:
                n_spans = getattr(frame, "n_spans", 0) or 0
            self.dropped_spans += n_spans
            drop = getattr(frame, "drop", None)  # (a step: its CUDA events back to the pool)
            if drop is not None:
                drop()
            return False

    resolve_errors = 0  # frames that could not be resolved or encoded (dropped, counted)

    def _could_not(self, item, what: str) -> None:
        """On the sink's thread, in an `except`: a frame that could not be resolved or encoded
        is dropped and counted (its spans too); the first such error is printed with its
        traceback (the rank's output), and the thread goes on."""
        self.resolve_errors += 1
        self.dropped_frames += 1
        try:
            self.dropped_spans += int(getattr(item, "n_spans", 0) or 0)
        except Exception:  # noqa: BLE001
            pass
        if self.resolve_errors == 1:
            import traceback
            sys.stderr.write(f"ddptui rank {self.rank}: a step could not be resolved or "
                             f"encoded; dropped (counted), {what} goes on\n"
                             f"{traceback.format_exc(limit=8)}")
            sys.stderr.flush()

    def _final(self, item):
        """A Bye as it leaves the sink, with the sink's dropped counts as they are then (the
        steps queued before it are resolved after the training thread made it: one that could
        not be is counted in it). A rank's Bye is made without them."""
        if type(item) is frames.Bye:
            return frames.Bye(rank=item.rank, why=item.why, dropped=self.dropped_spans,
                              dropped_frames=self.dropped_frames)
        return item

    def send_now(self, frame: frames.Frame, timeout: float = 2.0) -> None:
        """Queue a frame that must not be dropped (hello, errors, bye), waiting if needed."""
        try:
            self.q.put(frame, timeout=timeout)
        except queue.Full:
            self.dropped_frames += 1


class Emitter(FrameQueue):
    def __init__(self, path: str, token: str, rank: int, maxsize: int = 256,
                 on_control=None, exit_grace_s: float = 3.0):
        super().__init__(maxsize)
        self.rank = rank
        self.on_control = on_control
        self.exit_grace_s = exit_grace_s
        self.closed = threading.Event()
        self.app_gone = threading.Event()
        self.step = -1
        self.phase = "starting"
        self.clock_residual_ns = None  # CUDA: GPU-timer mapping error at the last calibration
        self.clock_bound_ns = None  # CUDA: how far a mapped time may be off (CudaClock.bound_ns)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sndbuf = seams.socket_sndbuf()  # test seam: a small kernel buffer, so a stalled
        if sndbuf is not None:          # app's backlog overflows in a second
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        self.sock.connect(path)
        self.sock.sendall(wire.pack(frames.Auth(token=token, rank=rank, pid=os.getpid(),
                                                version=wire.PROTOCOL_VERSION)))
        self._tx = threading.Thread(target=self._send_loop, name="ddptui-tx", daemon=True)
        self._rx = threading.Thread(target=self._recv_loop, name="ddptui-rx", daemon=True)
        self._hb = threading.Thread(target=self._heartbeat, name="ddptui-hb", daemon=True)
        self._tx.start(); self._rx.start(); self._hb.start()

    # -- called from the training thread (put, send_now: FrameQueue) ---------------
    def close(self, timeout: float = 3.0) -> None:
        """Flush what is queued (bounded by timeout) and close the socket."""
        deadline = time.monotonic() + timeout
        while not self.q.empty() and time.monotonic() < deadline and not self.app_gone.is_set():
            time.sleep(0.01)
        self.closed.set()
        try:
            self.q.put_nowait(None)
        except queue.Full:
            pass
        self._tx.join(max(0.0, deadline - time.monotonic()))
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    # -- background ----------------------------------------------------------------
    def _encode(self, item) -> bytes:
        if callable(item):  # a step to resolve here, off the training thread (poll(lazy=True))
            item = item()
        if isinstance(item, tuple):  # resolved span batch from Recorder.poll
            strategy, step, base, kinds, idxs, t0, t1, iss = item
            return wire.pack(frames.spans_frame(self.rank, strategy, step, base, kinds, idxs,
                                                t0, t1, iss))
        return wire.pack(self._final(item))  # a ranks.frames Struct

    def _encode_or_drop(self, item) -> bytes:
        """`_encode`, but a frame whose resolution or encoding raises is dropped and counted
        (its spans too), and the first such error is printed with its traceback (the rank's
        output): the sender thread goes on, the run keeps its later steps and heartbeats."""
        try:
            return self._encode(item)
        except Exception:  # noqa: BLE001 - one bad step must not end the sender thread
            self._could_not(item, "sending")
            return b""

    def _send_loop(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            chunks = [self._encode_or_drop(item)]
            while len(chunks) < 64:  # batch whatever else is waiting into one send
                try:
                    nxt = self.q.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._sendall(chunks)
                    return
                chunks.append(self._encode_or_drop(nxt))
            if not self._sendall(chunks):
                return

    def _sendall(self, chunks) -> bool:
        try:
            self.sock.sendall(b"".join(chunks))
            return True
        except OSError:
            self._gone()
            return False

    def _heartbeat(self) -> None:
        while not self.closed.wait(1.0):
            res, bound = self.clock_residual_ns, self.clock_bound_ns
            waiting, entered, bucket, p2p = frames.UNSET, frames.UNSET, frames.UNSET, frames.UNSET
            if self.collectives is not None:
                try:
                    got = self.collectives()
                    w, entered = got[0], got[1]
                    waiting = frames.UNSET if w is None else w
                    if w is not None and len(got) > 2 and got[2] is not None:
                        bucket = got[2]
                    if w is not None and len(got) > 3 and got[3] is not None:
                        p2p = got[3]
                except Exception:  # noqa: BLE001 - never lose the heartbeat for it
                    pass
            self.put(frames.Hb(rank=self.rank, step=self.step, phase=self.phase,
                               dropped=self.dropped_spans, dropped_frames=self.dropped_frames,
                               ts=now_ns(), residual_ns=frames.UNSET if res is None else res,
                               bound_ns=frames.UNSET if bound is None else bound,
                               waiting=waiting, colls=entered, bucket=bucket, p2p=p2p))

    def _recv_loop(self) -> None:
        reader = wire.FrameReader(max_frame=1 << 20)
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            try:
                bodies = reader.feed(data)
            except ValueError:  # a length over the limit: the stream cannot be followed
                break
            for body in bodies:
                try:  # only control frames that follow the protocol reach the worker
                    msg = frames.decode(body)
                    if msg.type not in frames.CONTROL_FRAMES:
                        raise frames.FrameError(f"unexpected frame type {msg.type!r}")
                    frames.check(msg)
                except Exception as e:  # noqa: BLE001 - undecodable or against the protocol
                    print(f"ddptui rank {self.rank}: ignored a control frame ({e})",
                          file=sys.stderr, flush=True)
                    continue
                if type(msg) is frames.Dump:  # (here, on this thread: the training one may be stuck)
                    self._dump_fr()
                    continue
                if self.on_control is not None:
                    self.on_control(msg)
        self._gone()

    def _dump_fr(self) -> None:
        try:
            from ranks.core.flightrec import dump_to_dir
            dump_to_dir(self.rank)
        except Exception as e:  # noqa: BLE001 - a dump that fails leaves the run as it was
            print(f"ddptui rank {self.rank}: could not write its Flight Recorder ({type(e).__name__}: {e})",
                  file=sys.stderr, flush=True)

    def _gone(self) -> None:
        """The app closed the socket: ask the worker to stop, and exit if it cannot."""
        if self.closed.is_set() or self.app_gone.is_set():
            return
        self.app_gone.set()
        if self.on_control is not None:
            self.on_control(frames.Stop(why="app gone"))

        def _exit_later():
            time.sleep(self.exit_grace_s)
            if not self.closed.is_set():
                os._exit(EXIT_APP_GONE)

        threading.Thread(target=_exit_later, daemon=True).start()
