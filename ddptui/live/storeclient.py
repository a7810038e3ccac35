"""A running job's TCPStore, read as a client only (`ddptui attach HOST:PORT`).

The store every torchrun job has at MASTER_ADDR:MASTER_PORT holds, once the job called
`torch.distributed.debug.start_debug_server()`, each rank's debug server under the prefix
``debug_server``: key ``debug_server/rank<N>``, value ``http://<host>:<port>``. This module
speaks TCPStore's wire protocol itself (c10d's TCPStore.cpp and its libuv backend): a query
byte, then its arguments in the host's byte order (little-endian), a string as a u64 length
and its bytes. Only queries that change nothing are ever sent:

- VALIDATE (0, u32 magic; no reply) and PING (13, u32 nonce, echoed): what a torch client
  sends first; a port that does not echo the nonce is not a TCPStore;
- CHECK (5, u64 count, the keys; one byte: 0 ready, 1 not) for one key at a time;
- GET (3, the key; u64 length and the value), only after CHECK said the key is there (the
  older backend fails a GET of a missing key; WAIT, which torch's own `get` sends first, is
  never sent: it would block).

No SET, ADD, COMPARE_SET, DELETE, WAIT or APPEND: attaching never writes a key or changes the
job. A key on the wire is the one torch's client sends: its name after ``/`` (the
TCPStore's own key prefix; `list_keys` shows it without). Every socket operation has a timeout; every failure is `StoreError` with one line that
says what is wrong (no such host, nothing listening, not a store, no answer). Not torch's
client: it would retry for its whole timeout, print C++ stack traces, and hang on a port that
accepts and never answers (an HTTP server's).
"""
from __future__ import annotations

import os
import re
import socket
import struct
from urllib.parse import urlsplit

VALIDATE, GET, CHECK, PING = 0, 3, 5, 13
MAGIC = 0x3C85F7CE
READY = 0
PREFIX = "debug_server"
MAX_VALUE = 1 << 16  # a debug server's address is a few dozen bytes
MAX_RANKS = 4096  # ranks probed at most
GAP = 8  # ranks probed past the last one found (a rank that registers late, a gap)
_TARGET = re.compile(r"\[?([^\[\]]+?)\]?:(\d+)")


class StoreError(Exception):
    """The store cannot be read; the message is one line for the user."""


def parse_target(text: str) -> tuple[str, int]:
    """'HOST:PORT' (MASTER_ADDR:MASTER_PORT; '[::1]:29500' for IPv6) -> (host, port);
    ValueError with what is wrong."""
    m = _TARGET.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None or not m.group(1) or any(c.isspace() for c in m.group(1)):
        raise ValueError(f"{text!r} is not HOST:PORT (the job's MASTER_ADDR:MASTER_PORT, e.g. node0:29500)")
    port = int(m.group(2))
    if not 1 <= port <= 65535:
        raise ValueError(f"{text!r}: port {port} is not 1..65535")
    return m.group(1), port


class StoreClient:
    """One connection to a TCPStore, validated and pinged; `check`, `get`, `ranks` read it."""

    def __init__(self, host: str, port: int, timeout: float = 3.0):
        self.host, self.port, self.timeout = host, port, timeout
        where = f"{host}:{port}"
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except socket.gaierror:
            raise StoreError(f"{where}: no such host ({host!r} does not resolve)") from None
        except ConnectionRefusedError:
            raise StoreError(f"{where}: nothing listens on port {port} (is the job running? "
                             f"its MASTER_ADDR:MASTER_PORT)") from None
        except (socket.timeout, TimeoutError):
            raise StoreError(f"{where}: no answer within {timeout:g} s (a firewall, or a host that is down)") from None
        except OSError as e:
            raise StoreError(f"{where}: cannot connect ({e.strerror or e})") from None
        self.sock.settimeout(timeout)
        nonce = os.getpid() & 0xFFFFFFFF
        try:
            self._send(struct.pack("<BI", VALIDATE, MAGIC) + struct.pack("<BI", PING, nonce))
            got = self._recv(4)
        except StoreError:
            self.close()
            raise StoreError(f"{where} answers, but not as a PyTorch TCPStore (no reply to its ping "
                             f"within {timeout:g} s): is it the job's MASTER_PORT?") from None
        if struct.unpack("<I", got)[0] != nonce:
            self.close()
            raise StoreError(f"{where} answers, but not as a PyTorch TCPStore: is it the job's MASTER_PORT?")

    # -- the wire --------------------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as e:
            raise StoreError(f"{self.host}:{self.port}: the store closed the connection ({e.strerror or e})") from None

    def _recv(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            try:
                chunk = self.sock.recv(n - len(out))
            except (socket.timeout, TimeoutError):
                raise StoreError(f"{self.host}:{self.port}: the store did not answer within {self.timeout:g} s") from None
            except OSError as e:
                raise StoreError(f"{self.host}:{self.port}: the store closed the connection ({e.strerror or e})") from None
            if not chunk:
                raise StoreError(f"{self.host}:{self.port}: the store closed the connection")
            out += chunk
        return bytes(out)

    @staticmethod
    def _key(key: str) -> bytes:
        b = ("/" + key).encode()  # (torch's TCPStore sends every key after its prefix "/")
        return struct.pack("<Q", len(b)) + b

    # -- the queries -----------------------------------------------------------------------
    def check(self, key: str) -> bool:
        """Whether the key is in the store (CHECK; never waits)."""
        self._send(struct.pack("<BQ", CHECK, 1) + self._key(key))
        return self._recv(1)[0] == READY

    def checks(self, keys: list[str]) -> list[bool]:
        """CHECK of each key, the queries sent at once (one round trip)."""
        self._send(b"".join(struct.pack("<BQ", CHECK, 1) + self._key(k) for k in keys))
        got = self._recv(len(keys))
        return [b == READY for b in got]

    def get(self, key: str) -> bytes | None:
        """The key's value, or None when it is not there (CHECK first: GET of a missing key
        is not asked)."""
        if not self.check(key):
            return None
        self._send(bytes([GET]) + self._key(key))
        n = struct.unpack("<Q", self._recv(8))[0]
        if n > MAX_VALUE:
            self.close()
            raise StoreError(f"{self.host}:{self.port}: {key} holds {n:,} bytes, not a debug server's address")
        return self._recv(n)

    def ranks(self, prefix: str = PREFIX, known: dict[int, str] | None = None) -> dict[int, str]:
        """Each rank's debug server address (``<prefix>/rank<N>``): ranks 0, 1, ... probed until
        GAP in a row are missing. `known`: those already found (only the others are read)."""
        found = dict(known or {})
        r, missing = 0, 0
        while r < MAX_RANKS and missing < GAP:
            batch = [x for x in range(r, min(MAX_RANKS, r + GAP)) if x not in found]
            there = dict(zip(batch, self.checks([f"{prefix}/rank{x}" for x in batch]))) if batch else {}
            for x in range(r, min(MAX_RANKS, r + GAP)):
                if x in found:
                    missing = 0
                elif there.get(x):
                    value = self.get(f"{prefix}/rank{x}")
                    if value is not None:
                        found[x] = value.decode("utf-8", "replace")
                    missing = 0
                else:
                    missing += 1
            r += GAP
        return found

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def server_address(value: str) -> tuple[str, int] | None:
    """A debug server's address as registered ('http://host:port') -> (host, port); None for
    anything else."""
    try:
        u = urlsplit(value.strip())
        if u.scheme != "http" or not u.hostname or u.port is None:
            return None
        return u.hostname, u.port
    except ValueError:
        return None
