"""`ddptui serve`: the page textual-serve produces, in a real headless Chromium.

The browser loads the served page, the UI process starts behind its websocket, and the
screenshot (decoded by the browser itself) must hold the lanes' colours: forward, backward
and AllReduce bars. Every request the page makes must go to the local server. Skipped when
no Chromium is installed (Debian package `chromium`; .ci/run installs it when it can).
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from ddptui.cli.serve import local_templates, tab_command, parser
from ddptui.recording.follow import FollowSource
from ranks.recfile import RecordWriter
from ddptui.recording.synthetic import SyntheticRun

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DEMO = os.path.join(ROOT, "demo", "cpu-small-2ranks.ddptui")
COLOURS = {"forward": (0x5A, 0xA9, 0xFF), "backward": (0x3D, 0xDC, 0x84), "allreduce": (0xFF, 0x9F, 0x1A)}

COUNT_JS = """(async () => {
  const img = new Image(); img.src = "data:image/png;base64,%s"; await img.decode();
  const c = document.createElement("canvas"); c.width = img.width; c.height = img.height;
  const g = c.getContext("2d"); g.drawImage(img, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  const want = %s; const n = {};
  for (const k in want) n[k] = 0;
  for (let i = 0; i < d.length; i += 4)
    for (const k in want) { const w = want[k];
      if (Math.abs(d[i] - w[0]) < 8 && Math.abs(d[i + 1] - w[1]) < 8 && Math.abs(d[i + 2] - w[2]) < 8) n[k]++; }
  return n; })()"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.read()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # (its own session: the server and its tab processes)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def test_served_page_fetches_nothing_from_the_internet(tmp_path):
    page = open(os.path.join(local_templates(str(tmp_path)), "app_index.html")).read()
    assert "googleapis" not in page and "fonts/RobotoMono" in page


def test_tab_commands_replay_or_follow_never_launch_a_run():
    a = parser().parse_args(["demo/x.ddptui", "--speed", "2", "--loop"])
    assert tab_command(a).endswith("-m ddptui.cli.serve --tab demo/x.ddptui --speed 2.0 --loop")
    assert tab_command(a).startswith("exec ")  # the server's own child: it sees the server go
    a = parser().parse_args(["--attach", "runs/y.ddptui"])
    assert tab_command(a).endswith("-m ddptui.cli.serve --tab runs/y.ddptui --attach")


def test_follow_source_takes_up_what_a_live_run_appends(tmp_path):
    run = SyntheticRun("small", 2, ("naive", "ddp"), seed=1)
    path = str(tmp_path / "live.ddptui")
    w = RecordWriter(path, {"model": "small", "world": 2, "strategies": ["naive", "ddp"]})
    for f in run.header_frames() + run.step_frames(0):
        w.write(f)
    w.flush()
    src = FollowSource(path)
    src.start()
    assert not src.poll() and src.store.latest_complete("ddp") == 0
    for f in run.step_frames(1):
        w.write(f)
    w.flush()
    assert not src.poll() and src.store.latest_complete("ddp") == 1
    w.close()
    assert src.poll() and src.state == "finished"


async def cdp_shot(debug_port: int, url: str, out: str, timeout: float = 60.0) -> tuple[dict, list[str]]:
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{debug_port}/json/list") as r:
            target = next(t for t in await r.json() if t["type"] == "page")
        async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            ids = iter(range(1, 10**6))
            requests: list[str] = []

            async def call(method: str, **params):
                i = next(ids)
                await ws.send_str(json.dumps({"id": i, "method": method, "params": params}))
                while True:
                    msg = json.loads((await ws.receive()).data)
                    if msg.get("method") == "Network.requestWillBeSent":
                        requests.append(msg["params"]["request"]["url"])
                    if msg.get("id") == i:
                        return msg.get("result", {})

            await call("Network.enable")
            await call("Page.enable")
            await call("Emulation.setDeviceMetricsOverride", width=1600, height=1000, deviceScaleFactor=1, mobile=False)
            await call("Page.navigate", url=url)
            deadline = time.monotonic() + timeout
            counts: dict = {}
            while time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                shot = (await call("Page.captureScreenshot", format="png"))["data"]
                got = await call("Runtime.evaluate", expression=COUNT_JS % (shot, json.dumps(COLOURS)),
                                 awaitPromise=True, returnByValue=True)
                counts = got.get("result", {}).get("value") or {}
                with open(out, "wb") as f:  # (the last one, whatever it shows)
                    f.write(base64.b64decode(shot))
                if counts and all(v > 1500 for v in counts.values()):
                    break
            return counts, requests


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (Debian package chromium)")
def test_served_page_shows_the_timelines_in_a_real_browser(tmp_path):
    port, debug = free_port(), free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    server = subprocess.Popen([sys.executable, "-m", "ddptui.cli.main", "serve", DEMO, "--port", str(port), "--loop",
                               "--speed", "4", "--title", "browser test"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    browser = None
    try:
        wait_http(f"http://127.0.0.1:{port}/", 30)
        browser = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
                                    "--disable-dev-shm-usage", f"--remote-debugging-port={debug}",
                                    f"--user-data-dir={tmp_path / 'profile'}", "about:blank"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_http(f"http://127.0.0.1:{debug}/json/version", 30)
        shot = str(tmp_path / "browser.png")
        counts, requests = asyncio.run(cdp_shot(debug, f"http://127.0.0.1:{port}/", shot))
        if os.environ.get("DDPTUI_BROWSER_SHOT"):
            shutil.copy(shot, os.environ["DDPTUI_BROWSER_SHOT"])
    finally:
        for p in (browser, server):
            if p is not None:
                stop(p)
    assert all(v > 1500 for v in counts.values()), f"lane colours in the screenshot: {counts}"
    assert os.path.getsize(shot) > 10_000
    local = (f"http://127.0.0.1:{port}/", f"ws://127.0.0.1:{port}/", "data:")
    assert requests and all(u.startswith(local) for u in requests), requests
