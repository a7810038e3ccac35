"""Each rank's PyTorch debug server, asked from outside (`ddptui attach`).

`torch.distributed.debug.start_debug_server()` starts, on every rank, a small HTTP server (C++,
`_WorkerServer`) whose handlers answer ``POST /handler/<name>?<params>``; ``GET /handler/``
lists them. Those read here:

- ``fr_trace_json``: the rank's Flight Recorder as JSON (`entries`, `pg_config`, `pg_status`,
  `version`; no `entries` key while the buffer is empty);
- ``dump_traceback``: every Python thread's stack, as `faulthandler` writes it (model/pystack.py);
- ``torch_profile?duration=S``: S seconds of torch.profiler on every thread, a Chrome trace
  (JSON), answered after the S seconds.

Never rank 0's HTML front page (the `port` of start_debug_server, which itself polls every
rank). `post` caps what it reads (`cap` bytes: a longer reply is refused, not read), times out
(`timeout` s for the connection and each read, and `deadline` s in all), and never raises: a
`Reply` says what went wrong in a phrase ("unreachable (connection refused)", "no answer
within 3 s", "a reply of 80 MB, over the 64 MB cap", "HTTP 404: ..."). `json_of` decodes a reply,
saying where it is not JSON.
"""
from __future__ import annotations

import http.client
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlencode

import msgspec

CHUNK = 1 << 20  # (a 2,000-entry buffer's reply is ~1 MB: read in one or two calls, not sixteen)


@dataclass(frozen=True)
class Reply:
    """One handler's answer: its body, or the phrase saying why there is none."""
    ok: bool
    body: bytes = b""
    error: str = ""
    seconds: float = 0.0


def post(host: str, port: int, handler: str, params: dict | None = None, *, timeout: float = 3.0,
         cap: int = 64 << 20, deadline: float | None = None) -> Reply:
    """POST /handler/<handler>?params to one rank's debug server (module docstring)."""
    t0 = time.monotonic()
    end = t0 + (deadline if deadline is not None else timeout)
    path = f"/handler/{handler}" + (f"?{urlencode(params)}" if params else "")
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        try:
            conn.request("POST", path, headers={"Content-Length": "0"})
            resp = conn.getresponse()
            status = resp.status
            size = resp.getheader("Content-Length")
            if size is not None and size.isdigit() and int(size) > cap:
                return Reply(False, error=f"a reply of {_mb(int(size))}, over the {_mb(cap)} cap (not read)",
                             seconds=time.monotonic() - t0)
            body = bytearray()
            while True:
                if time.monotonic() > end:
                    return Reply(False, error=f"the reply took longer than {end - t0:g} s (not read to its end)",
                                 seconds=time.monotonic() - t0)
                chunk = resp.read(CHUNK)
                if not chunk:
                    break
                body += chunk
                if len(body) > cap:
                    return Reply(False, error=f"a reply over the {_mb(cap)} cap (not read to its end)",
                                 seconds=time.monotonic() - t0)
        except socket.gaierror:
            return Reply(False, error=f"unreachable ({host!r} does not resolve from here)", seconds=time.monotonic() - t0)
        except ConnectionRefusedError:
            return Reply(False, error="unreachable (connection refused: its server is gone)", seconds=time.monotonic() - t0)
        except (socket.timeout, TimeoutError):
            return Reply(False, error=f"no answer within {timeout:g} s", seconds=time.monotonic() - t0)
        except (OSError, http.client.HTTPException) as e:
            why = getattr(e, "strerror", None) or str(e) or type(e).__name__
            return Reply(False, error=f"unreachable ({why})", seconds=time.monotonic() - t0)
    finally:
        conn.close()
    took = time.monotonic() - t0
    if status != 200:
        text = bytes(body[:200]).decode("utf-8", "replace").strip().splitlines()
        return Reply(False, error=f"HTTP {status}" + (f": {text[0][:120]}" if text else ""), seconds=took)
    return Reply(True, bytes(body), seconds=took)


def json_of(reply: Reply) -> tuple[object | None, str]:
    """A reply's JSON (None and why when it is not: 'not JSON (an HTML page?)')."""
    if not reply.ok:
        return None, reply.error
    try:
        return msgspec.json.decode(reply.body), ""
    except msgspec.DecodeError as e:
        head = reply.body.lstrip()[:1]
        what = " (an HTML page?)" if head == b"<" else ""
        return None, f"not JSON{what}: {str(e).splitlines()[0][:100]}"


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.0f} MB" if n >= 1 << 20 else f"{n:,} bytes"
