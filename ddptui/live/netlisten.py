"""Multi-node: node 0's TCP listener (only with --listen), and the handshake both ends speak.

Ranks on other hosts reach node 0 through `ddptui join` (ddptui/cli/join.py), which opens
one *control* connection for its node (settings, clock exchanges, the end of the run) and
one *rank* connection per local rank (that rank's frames, forwarded byte for byte). Every
connection starts with the same handshake; the token never crosses the wire:

    node 0 -> frames.Challenge(version, run, nonce)               fresh random nonce
    client -> frames.Join(role, node, rank?, host, run, cnonce, mac)
    node 0 -> frames.Welcome(mac, settings?)                      proves node 0 knows it too

mac = HMAC-SHA256(token, the fields above joined), so a captured handshake is useless on a
new connection (its nonce differs; a client nonce seen before is refused as a replay); a
client of another run names another run id. Rejections are logged and recorded as
``reject`` frames (the Feed's damage policy); the run goes on. A peer whose join frame is
whole but refused (wrong token, another run, a node that has joined, a rank that is not its
node's) is told why in a ``frames.End(why)`` frame, so `ddptui join` stops instead of
retrying; anything else (silence, garbage) is just closed.

Doors held open by idle peers: handshakes in progress cost a socket, no thread; a peer must
send its join frame within JOIN_WITHIN s of the challenge, and with MAX_PENDING in progress
the oldest is dropped for the newest. A legitimate join answers within a round trip, so
idle connections cannot keep it out; `ddptui join` retries for a while when its connection
is closed unanswered. After the handshake a rank
connection is the collector's, exactly like a local Unix-socket one: the same frame limits,
the same Feed and frame rules, the token check replaced by the handshake (ddptui/ingest/collector.py).

Control connection after the handshake: node 0 sends ``frames.Ping(seq, t1)`` bursts (at
connect, then every few seconds), the join answers ``frames.Pong(seq, t1, t2, t3)`` on its
own clock; ddptui/model/clocksync.py turns them, refined from the run's collectives, into
the host's offset, which goes into the store (and the recording) as ``frames.Clock`` frames.
``frames.End`` or a closed connection ends the join. Every one of these frames is a
ranks.frames Struct (NET_FRAMES), decoded and validated by ``frames.decode``.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import selectors
import socket
import stat
import threading
import time

import msgspec

from ranks import frames, wire
from ranks.clock import now_ns
from ranks.frames import UNSET, FrameError

from ddptui.model.clocksync import ClockEstimate, clock_frame, refine

HANDSHAKE_MAX = 64 * 1024  # bytes of one handshake or control frame
HANDSHAKE_TIMEOUT = 5.0  # a client's wait for each handshake frame
JOIN_WITHIN = 2.0  # node 0: a peer's join frame must come this soon after the challenge
MAX_PENDING = 256  # handshakes in progress at once (more: the oldest is dropped)


class NetError(Exception):
    """A one-line reason a connection or handshake failed."""


def read_token_file(path: str) -> bytes:
    """The shared secret; refused when the file is not a regular file (a FIFO, a device, a
    directory: opened without blocking and checked before anything is read) or is readable
    or writable by others."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise NetError(f"--token-file {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NetError(f"--token-file {path}: not a regular file")
        if st.st_mode & 0o077:
            raise NetError(f"--token-file {path}: readable by others (mode {st.st_mode & 0o777:o}); "
                           f"chmod 600 {path}")
        data = os.read(fd, 4096)
    except OSError as e:
        raise NetError(f"--token-file {path}: {e.strerror}") from None
    finally:
        os.close(fd)
    tok = data.strip()
    if len(tok) < 16:
        raise NetError(f"--token-file {path}: the token must be at least 16 characters")
    return tok


def parse_hostport(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise NetError(f"{what} {text!r}: expected HOST:PORT")
    return host, int(port)


def mac(token: bytes, *parts) -> str:
    msg = "|".join(str(p) for p in ("ddptui-join-1", *parts)).encode()
    return hmac.new(token, msg, hashlib.sha256).hexdigest()


def _refused(why) -> "Refused":
    return Refused(f"node 0 refused: {why[:200] if isinstance(why, str) else 'no reason given'}")


def check_net(body: bytes, t: str) -> frames.Frame:
    """One body of the handshake or the control connection, which must be a frame of type `t`
    (a NET_FRAMES name): its Struct (``type(f) is frames.BY_TAG[t]``), decoded and validated
    by frames.decode. NetError otherwise, saying which came first: an ``end`` frame while
    expecting another is node 0's refusal (Refused: "node 0 refused: why"), then a frame of
    another type ("expected a join frame, got 'x'"), then one that breaks its rules
    ("invalid join frame: ...")."""
    want = frames.BY_TAG[t]
    try:
        f = frames.decode(body)
    except frames.Undecodable as e:
        raise NetError(str(e)) from None
    except FrameError as e:  # decodes, breaks its rules: a refusal or another type says so first
        try:
            raw = msgspec.msgpack.decode(body)
        except Exception:  # noqa: BLE001 - frames.decode read it; be safe anyway
            raw = None
        if type(raw) is not dict:
            raise NetError(f"undecodable frame ({e})") from None
        got = raw.get("t")
        if t != "end" and got == "end":  # node 0 refused, and says why
            raise _refused(raw.get("why")) from None
        if got != t:
            raise NetError(f"expected a {t} frame, got {str(got)[:20]!r}") from None
        raise NetError(str(e) if str(e).startswith(f"invalid {t} frame") else f"invalid {t} frame: {e}") from None
    cls = type(f)
    if cls is frames.End and want is not frames.End:  # node 0 refused, and says why
        raise _refused(f.why)
    if cls is not want:
        raise NetError(f"expected a {t} frame, got {frames.TAG[cls][:20]!r}")
    return f


def recv_frame(sock: socket.socket, reader: wire.FrameReader, t: str, timeout: float,
               strict: bool = False) -> frames.Frame:
    """One frame of type t (a NET_FRAMES name: its Struct comes back, e.g. frames.Ping for
    "ping"; blocking, bounded by timeout); what follows it stays in `reader` (strict: nothing
    may follow it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            bodies = reader.feed(b"")
        except ValueError as e:
            raise NetError(str(e)) from None
        if bodies:
            if strict and (len(bodies) > 1 or reader.pending):
                raise NetError("spoke out of turn")
            reader.buf[:0] = b"".join(wire.LEN.pack(len(b)) + b for b in bodies[1:])
            return check_net(bodies[0], t)
        left = deadline - time.monotonic()
        if left <= 0:
            raise NetError(f"no {t} frame within {timeout:.0f} s")
        sock.settimeout(left)
        try:
            data = sock.recv(HANDSHAKE_MAX)
        except socket.timeout:
            raise NetError(f"no {t} frame within {timeout:.0f} s") from None
        except OSError as e:
            raise NetError(f"connection failed ({e.strerror or e})") from None
        if not data:
            raise NetError("connection closed during the handshake")
        reader.buf += data


def client_handshake(sock: socket.socket, token: bytes, role: str, node: int, run: str | None = None,
                     r: int | None = None, timeout: float = HANDSHAKE_TIMEOUT,
                     reader: wire.FrameReader | None = None) -> tuple[frames.Welcome, str]:
    """The client's side; returns node 0's welcome (its settings for role ctl; UNSET for a
    rank connection) and the run's id. `run`: the run this client belongs to (None: whichever
    node 0 runs, i.e. the first connection)."""
    reader = reader or wire.FrameReader(HANDSHAKE_MAX)
    ch = recv_frame(sock, reader, "challenge", timeout, strict=True)
    if ch.version != wire.PROTOCOL_VERSION:
        raise NetError(f"node 0 speaks protocol version {ch.version}, this ddptui {wire.PROTOCOL_VERSION}")
    run = ch.run if run is None else run
    cnonce = secrets.token_hex(16)
    host = socket.gethostname()[:200]
    j = frames.Join(role=role, node=node, rank=UNSET if r is None else r, host=host, run=run, cnonce=cnonce,
                    mac=mac(token, "c", ch.nonce, cnonce, run, role, node, -1 if r is None else r, host))
    sock.sendall(wire.pack(j))
    w = recv_frame(sock, reader, "welcome", timeout)
    settings = None if w.settings is UNSET else w.settings
    if not hmac.compare_digest(w.mac, mac(token, "s", cnonce, ch.nonce, run, _canon(settings))):
        raise NetError("node 0 did not prove it knows the token")
    return w, run


class NetListener:
    """Node 0's TCP listener. `settings` go to each join's control connection; rank
    connections are handed to `collector.adopt(sock, node, rank)`."""

    def __init__(self, host: str, port: int, token: bytes, run_id: str, settings: dict, collector,
                 feed, store, ping_every: float = 3.0):
        self.token, self.run_id, self.settings = token, run_id, settings
        self.collector, self.feed, self.store = collector, feed, store
        self.ping_every = ping_every
        self.clocks: dict[int, ClockEstimate] = {}
        self.ctl: dict[int, socket.socket] = {}
        self.seen_cnonces: set[str] = set()
        self.lock = threading.Lock()
        self.join_within = min(JOIN_WITHIN, HANDSHAKE_TIMEOUT)
        if settings.get("nproc_per_node"):
            collector.per_node = settings["nproc_per_node"]
        self._stop = threading.Event()
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            raise NetError(f"--listen {host}:{port}: {e.strerror}") from None
        fam, _, _, _, addr = infos[0]
        self.srv = socket.socket(fam, socket.SOCK_STREAM)
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.srv.bind(addr)
        except OSError as e:
            self.srv.close()
            raise NetError(f"--listen {host}:{port}: {e.strerror}") from None
        self.srv.listen(64)
        self.address = self.srv.getsockname()[:2]
        self._thread = threading.Thread(target=self._accept_loop, name="ddptui-net", daemon=True)
        self._thread.start()

    # -- public ----------------------------------------------------------------------
    def close(self, why: str = "run ended") -> None:
        self._stop.set()
        try:
            self.srv.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.srv.close()
        with self.lock:
            ctl = list(self.ctl.values())
            self.ctl.clear()
        for s in ctl:
            try:
                s.settimeout(1.0)
                s.sendall(wire.pack(frames.End(why=why[:200])))
            except OSError:
                pass
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self._thread.join(2.0)

    # -- accepting: one thread, every handshake in progress in one selector ------------------
    def _accept_loop(self) -> None:
        """Handshakes in progress hold a socket and a small buffer, no thread: a peer that
        says nothing is dropped after `join_within` s, and when MAX_PENDING are in progress
        the oldest is dropped for the newest (a legitimate join answers the challenge within
        a round trip, so idle connections, however many and however often reopened, cannot
        keep it out)."""
        sel = selectors.DefaultSelector()
        self.srv.setblocking(False)
        sel.register(self.srv, selectors.EVENT_READ, None)
        pending: dict[socket.socket, _Handshake] = {}  # oldest first

        def drop(hs: _Handshake, why: str | None, tell: bool = False) -> None:
            pending.pop(hs.sock, None)
            try:
                sel.unregister(hs.sock)
            except (KeyError, ValueError):
                pass
            if why is not None:
                self._refuse(hs.peer, why)
                if tell:  # the peer speaks the protocol: it learns why (and does not retry)
                    try:
                        hs.sock.send(wire.pack(frames.End(why=why[:200])))
                    except OSError:
                        pass
            hs.sock.close()

        try:
            while not self._stop.is_set():
                for key, _ in sel.select(0.1):
                    if key.data is None:
                        self._accept_some(sel, pending, drop)
                        continue
                    hs = key.data
                    try:
                        done = self._handshake_read(hs)
                    except _Refused as e:
                        drop(hs, str(e), tell=True)
                        continue
                    except (NetError, OSError) as e:
                        drop(hs, str(e) if isinstance(e, NetError) else f"connection failed ({e.strerror or e})")
                        continue
                    if done is not None:
                        pending.pop(hs.sock, None)
                        sel.unregister(hs.sock)
                        self._joined(hs, *done)
                now = time.monotonic()
                for hs in [h for h in pending.values() if h.deadline < now]:
                    drop(hs, f"no join frame within {self.join_within:g} s")
        finally:
            for hs in list(pending.values()):
                drop(hs, None)
            sel.close()

    def _accept_some(self, sel, pending: dict, drop) -> None:
        for _ in range(64):
            try:
                s, peer = self.srv.accept()
            except BlockingIOError:
                return
            except OSError:  # out of descriptors, or closing: try again shortly
                if not self._stop.is_set():
                    time.sleep(0.05)
                return
            if len(pending) >= MAX_PENDING:
                drop(next(iter(pending.values())), "too many handshakes in progress (the oldest is dropped)")
            hs = _Handshake(s, peer, secrets.token_hex(16), time.monotonic() + self.join_within)
            try:
                s.setblocking(False)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.send(wire.pack(frames.Challenge(version=wire.PROTOCOL_VERSION, run=self.run_id,
                                                    nonce=hs.nonce)))
            except OSError as e:
                self._refuse(peer, f"connection failed ({e.strerror or e})")
                s.close()
                continue
            pending[s] = hs
            sel.register(s, selectors.EVENT_READ, hs)

    def _refuse(self, peer, why: str) -> None:
        self.feed.reject(None, "join", f"{_peer(peer)}: {why}")

    def _handshake_read(self, hs: "_Handshake"):
        """What a peer in the handshake sent: None until its join frame is whole; then
        (its frames.Join, settings for a control connection or None). _Refused: a complete join
        frame this listener refuses (its peer is told why); NetError: anything else."""
        data = hs.sock.recv(HANDSHAKE_MAX)
        if not data:
            raise NetError("connection closed during the handshake")
        try:
            bodies = hs.reader.feed(data)
        except ValueError as e:
            raise NetError(str(e)) from None
        if not bodies:
            return None
        if len(bodies) > 1 or hs.reader.pending:
            raise NetError("spoke out of turn")
        j = check_net(bodies[0], "join")
        if j.run != self.run_id:
            raise _Refused(f"a client of another run ({j.run[:20]!r})")
        r = -1 if j.rank is UNSET else j.rank
        want = mac(self.token, "c", hs.nonce, j.cnonce, j.run, j.role, j.node, r, j.host)
        if not hmac.compare_digest(j.mac, want):
            with self.lock:
                replay = j.cnonce in self.seen_cnonces
            raise _Refused("replayed handshake" if replay else "wrong token (handshake MAC does not match)")
        with self.lock:
            if j.cnonce in self.seen_cnonces:
                raise _Refused("replayed handshake")
            self.seen_cnonces.add(j.cnonce)
        settings = None
        if j.role == "rank":
            if j.rank is UNSET:
                raise _Refused("a rank connection without its rank")
            if j.node not in self.ctl:
                raise _Refused(f"a rank connection of node {j.node}, which has not joined")
            why = self.collector.refuse_claim(j.node, j.rank)
            if why:
                raise _Refused(why)
        else:
            with self.lock:
                if j.node == 0:  # no --node-rank: the lowest free one
                    free = set(range(1, self.settings["nnodes"])) - set(self.ctl)
                    if not free:
                        raise _Refused(f"every node of the run's {self.settings['nnodes']} has joined")
                    j.node = min(free)
                if j.node in self.ctl:
                    raise _Refused(f"node {j.node} has joined already")
                if j.node >= self.settings["nnodes"]:
                    raise _Refused(f"node rank {j.node} but the run has {self.settings['nnodes']} nodes")
                self.ctl[j.node] = hs.sock
            settings = {**self.settings, "node_rank": j.node}
        return j, settings

    def _joined(self, hs: "_Handshake", j: frames.Join, settings: dict | None) -> None:
        """The welcome; then a rank connection goes to the collector, a control connection
        to its own thread."""
        s = hs.sock
        w = frames.Welcome(mac=mac(self.token, "s", j.cnonce, hs.nonce, self.run_id, _canon(settings)),
                           settings=UNSET if settings is None else settings)
        try:
            s.settimeout(HANDSHAKE_TIMEOUT)
            s.sendall(wire.pack(w))
        except OSError as e:
            self._refuse(hs.peer, f"connection failed ({e.strerror or e})")
            if settings is not None:
                with self.lock:
                    if self.ctl.get(j.node) is s:
                        del self.ctl[j.node]
            s.close()
            return
        if j.role == "rank":
            s.settimeout(None)
            self.collector.adopt(s, j.node, j.rank)
            return
        self.store.add_log(f"node {j.node} ({j.host}, {_peer(hs.peer)}) joined", "info")
        threading.Thread(target=self._control, args=(s, j.node, j.host, hs.reader), name="ddptui-net-ctl",
                         daemon=True).start()

    # -- the control connection: clock exchanges ----------------------------------------
    def _control(self, s: socket.socket, node: int, host: str, reader: wire.FrameReader) -> None:
        """A burst of pings at connect and every `ping_every` s; in between, once a second,
        the estimate is refined from the collectives the store has seen. A `clock` frame goes
        out when the estimate moves (ddptui/model/clocksync.py)."""
        est = self.clocks.setdefault(node, ClockEstimate())
        seq = 0
        burst = 16
        why = "closed"
        last: tuple | None = None
        refined = False
        next_burst = 0.0
        try:
            while not self._stop.is_set():
                if time.monotonic() >= next_burst:
                    for _ in range(burst):
                        seq += 1
                        t1 = now_ns()
                        s.sendall(wire.pack(frames.Ping(seq=seq, t1=t1)))
                        p = recv_frame(s, reader, "pong", 5.0)
                        t4 = now_ns()
                        if p.seq == seq and p.t1 == t1:
                            est.add(t1, p.t2, p.t3, t4)
                        time.sleep(0.005)
                    est.end_burst()
                    burst = 8
                    next_burst = time.monotonic() + self.ping_every
                if est.known:
                    ref = refine(est, self.store.clock_samples(node))
                    # once refined, a refinement that fails keeps the last one (no jump back)
                    if ref is not None or not refined:
                        refined = refined or ref is not None
                        f = clock_frame(node, host, est, ref)
                        key = (f.offset_ns // 1000, f.uncertainty_ns // 1000, est.samples)
                        if key != last:  # moved by a microsecond, or a new burst
                            last = key
                            self.feed.note(f)
                if self._stop.wait(min(1.0, self.ping_every)):
                    break
        except (NetError, OSError) as e:
            why = str(e) if isinstance(e, NetError) else (e.strerror or str(e))
        finally:
            with self.lock:
                gone = self.ctl.pop(node, None) is s
            if gone and not self._stop.is_set():
                self.store.add_log(f"node {node} ({host}) control connection lost: {why}", "warn")
                s.close()


class _Refused(NetError):
    """A complete, well-formed join frame that node 0 refuses (the peer is told why)."""


class Refused(NetError):
    """Node 0 refused this join and said why (a wrong token, another run ...): no retry helps."""


class _Handshake:
    __slots__ = ("sock", "peer", "nonce", "deadline", "reader")

    def __init__(self, sock, peer, nonce: str, deadline: float):
        self.sock, self.peer, self.nonce, self.deadline = sock, peer, nonce, deadline
        self.reader = wire.FrameReader(HANDSHAKE_MAX)


def _canon(settings: dict | None) -> str:
    """The welcome's settings as the MAC covers them (None: a rank connection's, without
    settings). Node 0 computes it from its own dict, the join from the decoded
    ``Welcome.settings``: both sides must produce the same bytes."""
    return json.dumps(settings, sort_keys=True, separators=(",", ":"))


def _peer(peer) -> str:
    try:
        return f"{peer[0]}:{peer[1]}"
    except (TypeError, IndexError):
        return str(peer)
