"""The socket the ranks talk to: a Unix socket in a private (0700) directory.

Each connection must first send an ``auth`` frame carrying this run's random token; until
then nothing it says reaches the store. Garbage, oversized frames, a rank speaking for
another rank, or a silent client are rejected, logged, and have no effect on the run.
"""
from __future__ import annotations

import hmac
import os
import selectors
import shutil
import socket
import tempfile
import threading
import time

from ranks import wire

RANK_FRAMES = {"hello", "phase", "spans", "buckets", "event", "hb", "bye", "error"}


class _Conn:
    __slots__ = ("sock", "reader", "rank", "opened", "bye")

    def __init__(self, sock, max_frame):
        self.sock = sock
        self.reader = wire.FrameReader(max_frame)
        self.rank: int | None = None
        self.opened = time.monotonic()
        self.bye = False


class Collector:
    def __init__(self, store, token: str, sink=None, on_disconnect=None,
                 max_frame: int = wire.MAX_FRAME, auth_timeout: float = 5.0,
                 run_dir: str | None = None):
        self.store = store
        self.token = token
        self.sink = sink  # sink(body: bytes, frame: dict) for every accepted frame
        self.on_disconnect = on_disconnect
        self.max_frame = max_frame
        self.auth_timeout = auth_timeout
        self._own_dir = run_dir is None
        self.dir = run_dir or tempfile.mkdtemp(prefix="ddptui-")  # mode 0700
        self.path = os.path.join(self.dir, "ranks.sock")
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.path)
        os.chmod(self.path, 0o600)
        self.srv.listen(256)
        self.srv.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.srv, selectors.EVENT_READ, None)
        self.conns: dict[socket.socket, _Conn] = {}
        self.lock = threading.Lock()
        self.rejected = 0
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ddptui-collector", daemon=True)
        self._thread.start()

    # -- public ----------------------------------------------------------------------
    def send(self, msg: dict, rank: int | None = None) -> int:
        """Send a control message to every authenticated rank (or one). Never blocks:
        a rank whose socket is full misses it (and is told again by the caller)."""
        data = wire.pack(msg)
        n = 0
        with self.lock:
            for c in list(self.conns.values()):
                if c.rank is None or (rank is not None and c.rank != rank):
                    continue
                try:
                    c.sock.send(data)
                    n += 1
                except (BlockingIOError, OSError):
                    pass
        return n

    def connected_ranks(self) -> list[int]:
        with self.lock:
            return sorted(c.rank for c in self.conns.values() if c.rank is not None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        with self.lock:
            for c in list(self.conns.values()):
                self._drop(c, None)
        try:
            self.srv.close()
        finally:
            if self._own_dir:
                shutil.rmtree(self.dir, ignore_errors=True)
            else:
                try:
                    os.unlink(self.path)
                except OSError:
                    pass

    # -- loop ------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            for key, _ in self.sel.select(timeout=0.1):
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.data)
            now = time.monotonic()
            with self.lock:
                late = [c for c in self.conns.values()
                        if c.rank is None and now - c.opened > self.auth_timeout]
            for c in late:
                self._reject(c, "no token within %.0f s" % self.auth_timeout)

    def _accept(self) -> None:
        try:
            s, _ = self.srv.accept()
        except OSError:
            return
        s.setblocking(False)
        c = _Conn(s, self.max_frame)
        with self.lock:
            self.conns[s] = c
        self.sel.register(s, selectors.EVENT_READ, c)

    def _read(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(c, "closed")
            return
        try:
            bodies = c.reader.feed(data)
        except ValueError as e:
            self._reject(c, str(e))
            return
        for body in bodies:
            try:
                f = wire.unpack_body(body)
            except Exception as e:  # noqa: BLE001 - any decode failure is a bad client
                self._reject(c, f"undecodable frame ({type(e).__name__})")
                return
            if c.rank is None:
                if not self._auth(c, f):
                    return
                continue
            t = f.get("t")
            if t not in RANK_FRAMES:
                self._reject(c, f"unexpected frame type {t!r}")
                return
            if f.get("r") != c.rank:
                self._reject(c, f"rank {c.rank} sent a frame for rank {f.get('r')!r}")
                return
            try:
                self.store.ingest(f)
            except (ValueError, KeyError, TypeError) as e:
                self._reject(c, f"invalid {t} frame: {e}")
                return
            if t == "bye":
                c.bye = True
            if self.sink is not None:
                self.sink(body, f)
        if c.reader.pending >= 4:
            try:
                c.reader.feed(b"")  # a bad length prefix behind good frames
            except ValueError as e:
                self._reject(c, str(e))

    def _auth(self, c: _Conn, f: dict) -> bool:
        tok = f.get("token")
        r = f.get("r")
        if f.get("t") != "auth" or not isinstance(tok, str) or not isinstance(r, int):
            self._reject(c, "first frame is not an auth frame")
            return False
        if not hmac.compare_digest(tok.encode(), self.token.encode()):
            self._reject(c, "wrong token")
            return False
        c.rank = r
        self.accepted += 1
        return True

    def _reject(self, c: _Conn, why: str) -> None:
        self.rejected += 1
        who = f"rank {c.rank}" if c.rank is not None else "unauthenticated client"
        self.store.add_log(f"rejected {who}: {why}", "warn")
        with self.store.lock:
            self.store.rejected += 1
        self._drop(c, None)

    def _drop(self, c: _Conn, why) -> None:
        with self.lock:
            if self.conns.pop(c.sock, None) is None:
                return
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()
        if c.rank is not None and why is not None:
            with self.store.lock:
                info = self.store.ranks.get(c.rank)
                if info is not None:
                    info.connected = False
                self.store.version += 1
            if self.on_disconnect is not None:
                self.on_disconnect(c.rank, c.bye)
