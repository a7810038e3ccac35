"""`ddptui join ADDR:PORT --token-file F [--node-rank K]`: another node of a multi-node run.

Fetches the run's settings from node 0 (after the handshake of ddptui/live/netlisten.py), starts
this node's torchrun agent with them, forwards its ranks' frames to node 0 (one TCP
connection per rank, authenticated like the control connection), answers node 0's clock
pings, and exits — stopping its torchrun, leaving nothing running — when the run ends or
node 0 goes away. Also node 0's side of the command line (`--nnodes` ...).
"""
from __future__ import annotations

import argparse
import hmac
import os
import secrets
import shutil
import socket
import sys
import tempfile
import threading
import time

import msgspec

from ranks import frames, seams, wire
from ranks.clock import now_ns
from ranks.frames import UNSET

from .options import add_numeric

STR_ARGS_MAX = 64
RETRY_FOR = 60.0  # seconds a join keeps trying to reach node 0 (--retry-for)
RANK_RETRY_FOR = 20.0  # ... and each of its ranks' connections, once joined

# Test seam (ranks.seams.net_asym_ns): node 0's pings look this much slower on the way here
# than back (an asymmetric path, which no exchange can see): the join stamps a ping's arrival
# this late. The clock refinement from collectives is what corrects it.
ASYM_NS = seams.net_asym_ns()


# -- node 0's options (ddptui --nnodes N --node-rank 0 ...) ----------------------------------
def add_node0_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("multi-node (node 0; other nodes run `ddptui join`)")
    add_numeric(g, "--nnodes", default=None, help="nodes in the run (torchrun's c10d rendezvous)")
    add_numeric(g, "--node-rank", default=None, help="this node's rank: 0 (the others run `ddptui join`)")
    add_numeric(g, "--nproc-per-node", default=None, help="ranks per node")
    g.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT", help="torchrun's c10d rendezvous")
    g.add_argument("--listen", default=None, metavar="ADDR:PORT",
                   help="accept the other nodes' `ddptui join` here (no listener without it)")
    g.add_argument("--token-file", default=None, metavar="F",
                   help="the run's shared secret (mode 600); never sent over the network")


def node0_plan(a, plan):
    """(MultiNode, Plan of the whole run); ValueError with a one-line reason."""
    from ddptui.live.launcher import Plan
    from ddptui.live.launcher import plan as make_plan
    from ddptui.live.multinode import MultiNode
    from ddptui.live.netlisten import NetError, parse_hostport, read_token_file
    if a.node_rank not in (None, 0):
        raise ValueError(f"--node-rank {a.node_rank}: this command runs node 0; "
                         f"the other nodes run `ddptui join ADDR:PORT --token-file F`")
    if a.nproc_per_node is None or a.rdzv_endpoint is None:
        raise ValueError("--nnodes needs --nproc-per-node and --rdzv-endpoint")
    if a.listen and not a.token_file:
        raise ValueError("--listen needs --token-file")
    try:
        parse_hostport(a.rdzv_endpoint, "--rdzv-endpoint")
        if a.listen:
            host, port = parse_hostport(a.listen, "--listen")
            read_token_file(a.token_file)
            _probe_bind(host, port)
    except NetError as e:
        raise ValueError(str(e)) from None
    local = make_plan(a.nproc_per_node, None, a.device)
    m = MultiNode(a.nnodes, 0, a.nproc_per_node, a.rdzv_endpoint, a.listen, a.token_file)
    note = f"{a.nnodes} node(s) × {local.note}"
    return m, Plan(m.world, local.gpus, local.device, note)


def _probe_bind(host: str, port: int) -> None:
    """--listen's address can be bound (checked before anything starts)."""
    from ddptui.live.netlisten import NetError
    try:
        fam, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(fam, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(addr)
    except (OSError, IndexError) as e:
        raise NetError(f"--listen {host}:{port}: {getattr(e, 'strerror', None) or e}") from None


# -- the join verb -------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    from .common import Parser as _Parser
    p = _Parser(prog="ddptui join", description="Another node of a multi-node run: fetch its settings "
                "from node 0, start this node's torchrun agent, forward its ranks' frames.")
    p.add_argument("address", metavar="ADDR:PORT", help="node 0's --listen address")
    p.add_argument("--token-file", required=True, metavar="F", help="the run's shared secret (mode 600)")
    add_numeric(p, "--node-rank", default=None, lo=1, help="this node's rank (default: node 0 assigns one)")
    add_numeric(p, "--retry-for", default=RETRY_FOR, lo=0, metavar="S",
                help=f"keep trying this many seconds while node 0 is not up yet or closes the connection "
                     f"unanswered (busy, or flooded); a refusal (wrong token, another run) is final "
                     f"(default {RETRY_FOR:g}; 0: one try)")
    return p


def _check_settings(s) -> dict:
    from ddptui.live.netlisten import NetError
    try:
        ok = (type(s) is dict and all(type(s.get(k)) is int for k in ("nnodes", "nproc_per_node", "node_rank",
                                                                        "threads"))
              and all(type(s.get(k)) is str for k in ("rdzv_endpoint", "rdzv_id", "device"))
              and type(s.get("worker_args")) is list and len(s["worker_args"]) < STR_ARGS_MAX
              and all(type(x) is str and len(x) < 256 for x in s["worker_args"])
              and s["device"] in ("cpu", "cuda") and 1 <= s["nproc_per_node"] <= 64
              and 0 < s["node_rank"] < s["nnodes"] <= 64 and 1 <= s["threads"] <= 256)
    except Exception:  # noqa: BLE001
        ok = False
    if not ok:
        raise NetError("node 0 sent settings this ddptui cannot use")
    return s


class Join:
    def __init__(self, host: str, port: int, token: bytes, node_rank: int | None, log=None,
                 retry_for: float = RETRY_FOR):
        self.host, self.port, self.token = host, port, token
        self.log = log or (lambda text: print(f"ddptui join: {text}", file=sys.stderr, flush=True))
        self.stop_ev = threading.Event()
        self.why = ""
        self.pids: set[int] = set()
        self.socks: list[socket.socket] = []
        self.lock = threading.Lock()
        self.ctl, self.ctl_reader, w, self.run_id = self._dial("ctl", node_rank or 0, retry_for=retry_for)
        self.settings = _check_settings(None if w.settings is UNSET else w.settings)
        self.node = self.settings["node_rank"]

    def _dial(self, role: str, node: int, r: int | None = None, run: str | None = None,
              retry_for: float = RETRY_FOR) -> tuple[socket.socket, wire.FrameReader, frames.Welcome, str]:
        """Connect and handshake: the socket, its reader, node 0's welcome and the run's id.
        While node 0 cannot be reached or closes the connection unanswered, try again with
        backoff (saying so) for `retry_for` s. Refused: final."""
        from ddptui.live.netlisten import HANDSHAKE_MAX, NetError, Refused, client_handshake
        give_up = time.monotonic() + retry_for
        wait = 0.25
        what = "this node" if role == "ctl" else f"rank {r}"
        while True:
            reader = wire.FrameReader(HANDSHAKE_MAX)  # the first pings may come with the welcome
            s = None
            try:
                s = self._connect()
                w, run_id = client_handshake(s, self.token, role, node, run=run, r=r, reader=reader)
                return s, reader, w, run_id
            except Refused:
                if s is not None:
                    s.close()
                raise
            except NetError as e:
                if s is not None:
                    s.close()
                left = give_up - time.monotonic()
                if left <= 0 or self.stop_ev.is_set():
                    if retry_for > 0:
                        raise NetError(f"{e} (gave up after {retry_for:g} s of retries)") from None
                    raise
                wait = min(wait, left)
                self.log(f"{what}: {e}; retrying in {wait:.2g} s (gives up in {left:.0f} s)")
                if self.stop_ev.wait(wait):
                    raise NetError(f"{e} (stopped)") from None
                wait = min(wait * 2, 4.0)

    def _connect(self) -> socket.socket:
        from ddptui.live.netlisten import NetError
        try:
            s = socket.create_connection((self.host, self.port), timeout=10)
        except OSError as e:
            raise NetError(f"cannot reach node 0 at {self.host}:{self.port} ({e.strerror or e})") from None
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    # -- run ----------------------------------------------------------------------------
    def run(self) -> int:
        from ddptui.live.launcher import Launcher
        from ddptui.live.multinode import torchrun_cmd
        from ddptui.live.session import PROJECT_ROOT
        st = self.settings
        self.dir = tempfile.mkdtemp(prefix="ddptui-join-")  # 0700
        self.local_token = secrets.token_hex(16)
        path = os.path.join(self.dir, "ranks.sock")
        self.usrv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.usrv.bind(path)
        os.chmod(path, 0o600)
        self.usrv.listen(64)
        env = os.environ.copy()
        env.pop("TORCH_DISTRIBUTED_DEBUG", None)
        env.update({"DDPTUI_SOCKET": path, "DDPTUI_TOKEN": self.local_token, "PYTHONUNBUFFERED": "1",
                    "PYTHONPATH": PROJECT_ROOT + os.pathsep + env.get("PYTHONPATH", "")})
        if st["device"] == "cpu":
            env["OMP_NUM_THREADS"] = str(st["threads"])
        cmd = torchrun_cmd(st["nnodes"], self.node, st["nproc_per_node"], st["rdzv_endpoint"], st["rdzv_id"],
                           st["worker_args"], is_host=False)
        threading.Thread(target=self._ctl_loop, name="join-ctl", daemon=True).start()
        threading.Thread(target=self._accept_loop, name="join-accept", daemon=True).start()
        self.log(f"node {self.node} of {st['nnodes']}: starting {st['nproc_per_node']} rank(s) "
                 f"(rendezvous {st['rdzv_endpoint']})")
        self.launcher = Launcher(cmd, env, os.path.join(self.dir, "torchrun.log"), cwd=PROJECT_ROOT)
        rc = None
        try:
            while rc is None and not self.stop_ev.wait(0.1):
                rc = self.launcher.poll()
        except KeyboardInterrupt:
            self.why = "interrupted"
        if rc is None and self.why != "interrupted":  # the ranks see the end too: a moment to finish
            deadline = time.monotonic() + 5.0
            while rc is None and time.monotonic() < deadline:
                time.sleep(0.05)
                rc = self.launcher.poll()
        if rc is None:
            self.log(f"stopping this node's ranks: {self.why or 'stopped'}")
            rc = self.launcher.stop(grace=3.0, workers=sorted(self.pids))
        else:
            tail = [ln for ln in self.launcher.log_tail(2000).splitlines() if ln.strip()]
            self.launcher.stop(grace=1.0, workers=sorted(self.pids))
            if rc != 0 and tail:
                self.log(f"torchrun: {tail[-1].strip()}")
        self._close()
        self.log(f"done: {self.why or 'run finished'} (torchrun exit status {rc})")
        return 0 if rc == 0 else 1

    def _close(self) -> None:
        self.stop_ev.set()
        with self.lock:
            socks = [self.ctl, self.usrv, *self.socks]
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _end(self, why: str) -> None:
        if not self.stop_ev.is_set():
            self.why = why
            self.stop_ev.set()

    # -- the control connection: clock pings, the end ---------------------------------
    def _ctl_loop(self) -> None:
        from ddptui.live.netlisten import HANDSHAKE_MAX, NetError
        reader = self.ctl_reader
        s = self.ctl
        s.settimeout(None)
        try:
            data, t2 = b"", now_ns()
            while True:
                for body in reader.feed(data):
                    try:
                        f = frames.decode(body)
                    except frames.Undecodable:
                        raise
                    except frames.FrameError:  # another type is unexpected before it is invalid
                        raw = msgspec.msgpack.decode(body)
                        t = raw.get("t") if type(raw) is dict else None
                        if t not in ("ping", "end"):
                            raise NetError(f"unexpected {str(t)[:20]!r} frame") from None
                        raise
                    cls = type(f)
                    if cls is frames.End:
                        return self._end(f"node 0: {'run ended' if f.why is UNSET else f.why}")
                    if cls is not frames.Ping:
                        raise NetError(f"unexpected {frames.TAG[cls][:20]!r} frame")
                    s.sendall(wire.pack(frames.Pong(seq=f.seq, t1=f.t1, t2=t2, t3=now_ns())))
                data = s.recv(HANDSHAKE_MAX)
                if ASYM_NS:
                    time.sleep(ASYM_NS / 1e9)
                t2 = now_ns()  # the ping's arrival, as close to the wire as Python gets
                if not data:
                    return self._end("node 0 went away")
        except Exception as e:  # noqa: BLE001 - whatever breaks the control connection ends the join
            self._end(f"control connection failed ({type(e).__name__}: {e})")

    # -- ranks: local Unix socket -> one authenticated TCP connection each ---------------
    def _accept_loop(self) -> None:
        while not self.stop_ev.is_set():
            try:
                c, _ = self.usrv.accept()
            except OSError:
                return
            threading.Thread(target=self._rank, args=(c,), name="join-rank", daemon=True).start()

    def _rank(self, c: socket.socket) -> None:
        from ddptui.live.netlisten import NetError
        reader = wire.FrameReader(wire.MAX_FRAME)
        try:
            c.settimeout(5.0)
            bodies: list[bytes] = []
            while not bodies:
                data = c.recv(65536)
                if not data:
                    raise NetError("closed before its auth frame")
                bodies = reader.feed(data)
            try:
                f = frames.decode(bodies[0])
            except frames.FrameError:
                f = None
            if type(f) is not frames.Auth or not hmac.compare_digest(f.token.encode(), self.local_token.encode()):
                raise NetError("a local client without this node's token")
            if f.pid is not UNSET:
                self.pids.add(f.pid)
            up, _, _, _ = self._dial("rank", self.node, r=f.rank, run=self.run_id, retry_for=RANK_RETRY_FOR)
            up.settimeout(None)
            c.settimeout(None)
            rest = b"".join(wire.LEN.pack(len(b)) + b for b in bodies[1:]) + bytes(reader.buf)
            # the local token stays here: node 0 checked this connection's handshake instead
            up.sendall(wire.pack(msgspec.structs.replace(f, token="")) + rest)
        except Exception as e:  # noqa: BLE001 - one rank's connection; the rank exits without it
            self.log(f"a rank's connection failed: {type(e).__name__}: {e}")
            c.close()
            return
        with self.lock:
            self.socks += [c, up]
        threading.Thread(target=_pump, args=(up, c), name="join-down", daemon=True).start()
        _pump(c, up)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Bytes one way until either side closes; then both are shut."""
    buf = bytearray(1 << 20)  # (recv(1 MiB) would make and free a 1 MiB object a call)
    view = memoryview(buf)
    try:
        while True:
            n = src.recv_into(buf)
            if not n:
                break
            dst.sendall(view[:n])
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def main(argv: list[str]) -> int:
    import signal

    from .common import CliError, check_environment, sigterm_to_interrupt
    from ddptui.live.netlisten import NetError, parse_hostport, read_token_file
    a = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, sigterm_to_interrupt)  # stop this node's ranks, as Ctrl-C does
    try:
        host, port = parse_hostport(a.address, "address")
        token = read_token_file(a.token_file)
        check_environment()
        j = Join(host, port, token, a.node_rank, retry_for=a.retry_for)
    except NetError as e:
        raise CliError(str(e)) from None
    return j.run()
