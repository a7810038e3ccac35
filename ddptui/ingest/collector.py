"""The socket the ranks talk to: a Unix socket in a private (0700) directory.

Each connection must first send an ``auth`` frame carrying this run's random token; until
then nothing it says reaches the store. Garbage, oversized frames, a rank speaking for
another rank, or a silent client are rejected, logged, and have no effect on the run.

Multi-node: a rank connection from another node (adopted after its handshake) speaks only
for the rank its handshake named, and only for ranks of its node: the rendezvous gives
each node one block of `per_node` consecutive ranks, the first rank a node's connections
name fixes its block, a block is one node's only, and node 0's own ranks (local, with the
local token) always own theirs. Anything else is rejected (a ``reject`` frame) and the
connection dropped.
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

import msgspec

from ranks import frames, wire
from ranks.frames import FrameError

from .feed import Feed


class _Conn:
    __slots__ = ("sock", "reader", "rank", "opened", "bye", "owner", "last", "node", "claim")

    def __init__(self, sock, max_frame):
        self.sock = sock
        self.reader = wire.FrameReader(max_frame)
        self.rank: int | None = None
        self.opened = time.monotonic()
        self.bye = False
        self.owner = False  # sent its rank's hello: its close disconnects the rank
        self.last = None  # type of the frame being handled (for errors)
        self.node = None  # multi-node: a TCP connection of this node, its handshake done
        self.claim = None  # ... for this rank (named in its handshake)


class Collector:
    def __init__(self, store, token: str, feed: Feed | None = None, on_disconnect=None,
                 max_frame: int = wire.MAX_FRAME, auth_timeout: float = 5.0,
                 run_dir: str | None = None):
        self.store = store
        self.token = token
        self.feed = feed or Feed(store)  # its sink records every frame taken or made
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
        # one receive buffer for every connection (this thread's): recv(1 MiB) made and freed
        # a 1 MiB object per call (an mmap each, ~14 µs: a quarter of the collector's time at
        # 1,024 ranks); the reader copies what it is given
        self._rbuf = bytearray(1 << 20)
        self._rview = memoryview(self._rbuf)
        self.sel.register(self.srv, selectors.EVENT_READ, None)
        self.conns: dict[socket.socket, _Conn] = {}
        self._adopted: list[tuple[socket.socket, int, int]] = []  # multi-node (ddptui/live/netlisten.py)
        self.per_node = 1  # multi-node: ranks per node (set by the listener)
        self.blocks: dict[int, int] = {}  # multi-node: block of ranks -> the node that runs it
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ddptui-collector", daemon=True)
        self._thread.start()

    # -- public ----------------------------------------------------------------------
    def send(self, msg: frames.Stop | frames.Set | frames.Dump, rank: int | None = None) -> int:
        """Send a control frame (frames.Stop or frames.Set; a plain map from a test is
        validated the same way) to every authenticated rank (or one). Never blocks: a rank
        whose socket is full misses it (and is told again by the caller). Raises FrameError
        for anything else, or a control frame that breaks its rules."""
        if isinstance(msg, frames.Frame):
            t = frames.TAG[type(msg)]
        else:
            t = msg.get("t") if isinstance(msg, dict) else None
        if t not in frames.CONTROL_FRAMES:
            raise FrameError(f"{t!r} is not a control frame")
        f = frames.validate(msg)
        frames.check(f)
        data = wire.pack(f)
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

    def adopt(self, sock: socket.socket, node: int, rank: int) -> None:
        """Multi-node: a rank connection from another host whose handshake (ddptui/live/netlisten.py)
        proved the token, for `rank`; from here on it is read like a local one (its auth
        frame's token is not checked again; its rank must be `rank`, one of its node's)."""
        with self.lock:
            self._adopted.append((sock, node, rank))

    def refuse_claim(self, node: int, rank: int) -> str | None:
        """Multi-node: why node `node` may not speak for `rank` (None: it may), without
        taking the rank's block."""
        with self.lock:
            return self._claim(node, rank, take=False)

    def _claim(self, node: int, rank: int, take: bool = True) -> str | None:
        blk = rank // max(1, self.per_node)
        first, last = blk * self.per_node, blk * self.per_node + self.per_node - 1
        who = self.blocks.get(blk)
        if who is not None and who != node:
            return f"node {node} spoke for rank {rank}, which node {who} runs (ranks {first}-{last})"
        mine = [b for b, n in self.blocks.items() if n == node and b != blk]
        if mine:
            b = mine[0] * self.per_node
            return f"node {node} spoke for rank {rank}, but its ranks are {b}-{b + self.per_node - 1}"
        if any(c.rank == rank for c in self.conns.values()):
            return f"node {node} spoke for rank {rank}, which is connected already"
        if take:
            self.blocks[blk] = node
        return None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        with self.lock:
            conns = list(self.conns.values())
        for c in conns:  # _drop takes the lock itself
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
                c = key.data
                try:
                    if c is None:
                        self._accept()
                    else:
                        self._read(c)
                except Exception as e:  # noqa: BLE001 - one connection's trouble, never the loop's
                    self._internal(c, e)
            if self._adopted:
                self._take_adopted()
            now = time.monotonic()
            with self.lock:
                late = [c for c in self.conns.values()
                        if c.rank is None and now - c.opened > self.auth_timeout]
            for c in late:
                self._reject(c, "no token within %.0f s" % self.auth_timeout)

    def _internal(self, c: _Conn | None, e: Exception) -> None:
        """An unexpected exception: logged with the frame type and rank, connection dropped."""
        if c is None:
            self.store.add_log(f"collector: accepting a connection failed ({type(e).__name__}: {e})", "error")
            return
        what = f" on a {c.last} frame" if c.last else ""
        try:
            self._reject(c, f"internal error{what} ({type(e).__name__}: {e})")
        except Exception:  # noqa: BLE001 - the store itself is failing: at least drop it
            self._drop(c, None)

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

    def _take_adopted(self) -> None:
        with self.lock:
            adopted, self._adopted = self._adopted, []
        for s, node, rank in adopted:
            s.setblocking(False)
            c = _Conn(s, self.max_frame)
            c.node, c.claim = node, rank
            with self.lock:
                self.conns[s] = c
            self.sel.register(s, selectors.EVENT_READ, c)

    def _read(self, c: _Conn) -> None:
        try:
            n = c.sock.recv_into(self._rbuf)
        except BlockingIOError:
            return
        except OSError:
            n = 0
        data = self._rview[:n]
        if not n:
            self._drop(c, "closed")
            return
        try:
            bodies = c.reader.feed(data)
        except ValueError as e:
            self._reject(c, str(e))
            return
        for body in bodies:
            c.last = None
            if c.rank is None:
                if not self._auth(c, body):
                    return
                continue
            f = self.feed.body(body, c.rank, frames.RANK_FRAMES)
            if f is None:  # rejected (logged, recorded): this connection is done
                self._drop(c, "rejected")
                return
            cls = type(f)
            c.last = frames.TAG[cls]
            if cls is frames.Hello:
                c.owner = True
            elif cls is frames.Bye:
                c.bye = True
        if c.reader.pending >= 4:
            try:
                c.reader.feed(b"")  # a bad length prefix behind good frames
            except ValueError as e:
                self._reject(c, str(e))

    def _auth(self, c: _Conn, body: bytes) -> bool:
        """A connection's first frame must be a frames.Auth with this run's token (not
        checked again for an adopted connection) and protocol version. Said in that order:
        not an auth frame, a wrong token, another version, then whatever else is invalid
        (so a frame that breaks its rules is still refused for the first of these)."""
        bad: FrameError | None = None
        try:
            f = frames.decode(body)
        except frames.Undecodable as e:  # not msgpack at all: a bad client
            self._reject(c, str(e))
            return False
        except FrameError as e:  # decodes, breaks its rules: the reasons above come first
            bad = e
            try:
                raw = msgspec.msgpack.decode(body)
            except Exception:  # noqa: BLE001 - frames.decode read it; be safe anyway
                raw = None
            if type(raw) is not dict:
                self._reject(c, f"undecodable frame ({e})")
                return False
            is_auth, tok, v = raw.get("t") == "auth", raw.get("token"), raw.get("v")
        else:
            is_auth = type(f) is frames.Auth
            tok, v = (f.token, f.version) if is_auth else (None, None)
        if not is_auth:
            self._reject(c, "first frame is not an auth frame")
            return False
        if c.node is None and (not isinstance(tok, str)
                               or not hmac.compare_digest(tok.encode(), self.token.encode())):
            self._reject(c, "wrong token")
            return False
        if v != wire.PROTOCOL_VERSION:
            self._reject(c, f"protocol version {str(v)[:20]}, but this ddptui speaks "
                            f"version {wire.PROTOCOL_VERSION} (ranks and app are from different versions)")
            return False
        if bad is None:
            try:
                frames.check(f, self.store.limits)
            except FrameError as e:
                bad = FrameError(f"invalid auth frame: {e}")
        if bad is not None:
            self._reject(c, str(bad))  # "invalid auth frame: ..."
            return False
        r = f.rank
        if c.node is not None:  # multi-node: only its own rank, of its node's block
            if r != c.claim:
                why = f"node {c.node}'s connection for rank {c.claim} spoke for rank {r}"
            else:
                with self.lock:
                    why = self._claim(c.node, r)
            if why:
                self._reject(c, why)
                return False
        else:  # node 0's own rank (local token): its block is node 0's
            self._take_for_node0(r)
        c.rank = r
        if c.node is not None:  # multi-node: the store learns this rank's host
            self.feed.note(frames.Node(rank=r, node=c.node))
        return True

    def _take_for_node0(self, rank: int) -> None:
        """A rank of node 0 whose block another node claimed: that node lied; its connections
        for the block are rejected and dropped."""
        blk = rank // max(1, self.per_node)
        with self.lock:
            liar = self.blocks.get(blk)
            self.blocks[blk] = 0
            gone = [c for c in self.conns.values()
                    if c.node is not None and c.node == liar and c.rank is not None
                    and c.rank // max(1, self.per_node) == blk]
        for c in gone:
            self._reject(c, f"node {liar} spoke for rank {c.rank}, which node 0 runs")
            self.feed.note(frames.Node(rank=c.rank, node=0))

    def _reject(self, c: _Conn, why: str) -> None:
        """Refuse a connection: a reject frame (logged, counted, recorded), then dropped."""
        self.feed.reject(c.rank, c.last, why)
        self._drop(c, "rejected")

    def _drop(self, c: _Conn, why) -> None:
        with self.lock:
            if self.conns.pop(c.sock, None) is None:
                return
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()
        if c.owner and why is not None:
            self.feed.note(frames.Drop(rank=c.rank, why=why, bye=c.bye))
            if self.on_disconnect is not None:
                self.on_disconnect(c.rank, c.bye)
