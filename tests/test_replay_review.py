"""What a user's-eye review of the H100 replay found: warm-up figures in the headline, keys
that did nothing without a word, NVLink N/A on a GPU without links, a simulated run's
GPU panel waiting forever. On the recordings the demo ships (demo/), the app under Pilot."""
from __future__ import annotations

import os

import pytest

from ddptui.model import figures
from ddptui.model.gpu import shared_gpu_note
from ddptui.recording.replay import ReplaySource
from ddptui.ui.widgets import figures_panel, gpu_panel
from ddptui.ui.widgets.headline import build as build_headline
from ranks import frames

from .helpers import ROOT, drawn

GLOO = os.path.join(ROOT, "demo", "gpu-h100-xlarge-2ranks-gloo.ddptui")
SIMULATED = os.path.join(ROOT, "demo", "simulated-a100-pcie-xlarge-4gpus.ddptui")


def text(parts) -> str:
    return "".join(t for t, _ in parts)


def still() -> int:
    return 10**9  # (a clock that never moves: the replay goes only where a test sends it)


def headline_at(src: ReplaySource, k: int, width: int = 200) -> str:
    """The headline as the app makes it, at step k."""
    src.seek(k)
    store = src.store
    rows = figures_panel.compare_rows(store, {s: k for s in store.strategies()})
    (line,) = build_headline(rows, figures.speedups(rows), width, why=shared_gpu_note(store.meta, rows))
    return text(line)


def test_the_headline_gives_no_figure_of_the_warm_up():
    """The H100 replay's first steps read 'naive hides 0 % … comm 236 ms vs compute 194.3 ms ·
    NVLink ≈ 1.9 ms', 'DDP 3.76× faster than naive', then on step 1 'DDP slower than naive
    here (0.60×)', where the run's steady state is DDP 1.25×, 8.7 ms compute, NVLink ≈ 0.9 ms."""
    src = ReplaySource(GLOO, clock=still)
    for k in (0, 1, 2):
        line = headline_at(src, k)
        assert f"waiting for steps past the warm-up to compare ({k}/3)…" in line, line
        assert "×" not in line and "NVLink" not in line and "ms" not in line
    assert "warming up (1/3)…" in headline_at(src, 1, 30)
    rows = figures_panel.compare_rows(src.store, {s: 1 for s in src.store.strategies()})
    (line,) = build_headline(rows, figures.speedups(rows), 200, slow="rank 1 · fc2 backward +40 ms")
    assert text(line).strip() == "slow: rank 1 · fc2 backward +40 ms · waiting for steps past the warm-up to compare (1/3)…"
    for k in (3, 20, 39):
        line = headline_at(src, k)
        assert "DDP 1.2" in line and "faster than naive" in line and "NVLink ≈ 0.9 ms" in line, line


def test_nvlink_is_left_out_where_the_gpu_has_none_and_a_simulated_run_says_it_has_no_samples():
    src = ReplaySource(GLOO, clock=still)
    src.seek(39)
    samples = src.store.samples()[0]
    lines = "\n".join(text(x) for x in gpu_panel.gpu_lines(samples, 120, 5))
    assert "PCIe ↑" in lines and "NVLink" not in lines and "N/A ↓N/A" not in lines
    linked = [frames.Gpu(ts=s.ts, gpus=[frames.GpuSample(**{**{f: getattr(g, f) for f in g.__struct_fields__},
                                                          "nvlink_tx_mbs": 2048.0, "nvlink_rx_mbs": 1024.0})
                                         for g in s.gpus]) for s in samples]
    lines = "\n".join(text(x) for x in gpu_panel.gpu_lines(linked, 120, 5))
    assert "NVLink ↑2.0 GB/s ↓1.0 GB/s" in lines
    sim = ReplaySource(SIMULATED, clock=still)
    sim.seek(sim.steps_total - 1)
    assert sim.store.samples() == ([], [])
    assert [text(x) for x in gpu_panel.build(sim.store, 120, 5)] == ["GPU / CPU: simulated: no device samples"]


async def settle(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    pilot.app.redraw()
    await pilot.pause()


@pytest.mark.asyncio
async def test_keys_that_cannot_do_all_they_say_say_so_and_the_lines_fit():
    """`-` at zoom 1× and `g 99` on a 40-step recording said nothing; paused on step 1 the
    headline gave warm-up figures; at 120x40 the title was cut mid-word."""
    from ddptui.ui.app import DdpApp

    src = ReplaySource(GLOO, clock=still)
    app = DdpApp(src)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        status = app.query_one("#status")
        await pilot.press("minus")
        await settle(pilot)
        assert "zoom 1× shows the whole step: + zooms in" in drawn(status)[0]
        assert app.vm.zoom == 1
        for key in ("g", "9", "9", "enter"):
            await pilot.press(key)
        await settle(pilot)
        line = drawn(status)[0]
        assert src.position_step == 39 and "step 39/39" in line
        assert "no step 99: the recording has steps 0–39, went to the last" in line
        for key in ("g", "1", "enter"):
            await pilot.press(key)
        await settle(pilot)
        assert "no step 99" not in drawn(status)[0] and "step 1/39" in drawn(status)[0]  # (the next key: gone)
        assert "waiting for steps past the warm-up" in drawn(app.query_one("#headline"))[0]
        assert "NVLink" not in "\n".join(drawn(app.query_one("#gpu")))
        title = drawn(app.query_one("#title"))[0].rstrip()
        assert title.endswith("…") and title[-2] != " " and len(title) <= 120
        full = text(app.title_line.lines[0])
        assert full.startswith(title[:-1]) and full[len(title) - 1] == " "  # (cut at a boundary)


def test_the_screen_page_says_what_the_gpu_panel_title_ends_with_as_the_gpu_page_does():
    """docs/screen.md said the GPU panel shows 'the clock calibration's residual'; the panel
    (and docs/gpu.md) end the title with the GPU clock's bound, 'clock ±X µs'."""
    def bullet(page: str, start: str) -> str:
        with open(os.path.join(ROOT, "docs", page), encoding="utf-8") as f:
            body = f.read()
        return body[body.index(start):].split("\n- ", 1)[0]

    screen = bullet("screen.md", "- **GPU / CPU**")
    assert "**clock ±X µs**" in screen and "**clock ±X µs**" in open(os.path.join(ROOT, "docs", "gpu.md")).read()
    assert "calibration's residual" not in screen and "simulated: no device samples" in screen
    src = ReplaySource(GLOO, clock=still)
    src.seek(5)
    title = text(gpu_panel.gpu_lines(src.store.samples()[0], 120, 3, clock_bound_ns=1500)[0])
    assert title.endswith("clock ±1.5 µs")
