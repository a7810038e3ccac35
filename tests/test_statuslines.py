"""The status lines around the panes (ddptui/ui/widgets/statuslines.py), without Textual."""
from __future__ import annotations

import types

import pytest

from ddptui.recording.synthetic import SyntheticSource
from ddptui.ui.widgets import statuslines


def text(parts) -> str:
    return "".join(t for t, _ in parts)


def test_the_legend_drops_entries_from_the_end_and_always_keeps_the_scale():
    wide, narrow = statuslines.legend(0.5, 2, 200), statuslines.legend(0.5, 2, 70)
    assert text(wide).endswith("1 cell = 0.5 ms · zoom 2× · one scale for all panes")
    assert text(narrow).endswith("1 cell = 0.5 ms · zoom 2×")
    names = [name for name, _ in statuslines.LEGEND]
    shown = [n for n in names if f" {n} " in text(narrow)]
    assert shown == names[:len(shown)] and 0 < len(shown) < len(names)  # the first ones stay
    assert len(text(narrow)) <= 70 and all(f" {n} " in text(wide) for n in names)


def test_title_and_status_say_what_the_store_holds():
    src = SyntheticSource(steps=3, world=4, model="small")
    st = src.store
    assert text(statuslines.title(st, ["naive", "ddp"], "my talk")).startswith(" ddptui  my talk ")
    assert "4 ranks" in text(statuslines.title(st, ["naive", "ddp"])) and "naive vs ddp" in text(statuslines.title(st, ["naive", "ddp"]))
    live = statuslines.live_state(src, 2, record="runs/x.ddptui")
    assert text(live).startswith(" ● LIVE  running · step 2") and "recording → runs/x.ddptui" in text(live)
    assert text(statuslines.live_state(src, 9, paused=True, pinned=4)).startswith(" ⏸ PAUSED  step 4 · training continues (latest 9)")
    assert "RUN FAILED" in text(statuslines.live_state(src, 2, error="boom"))
    assert text(statuslines.live_state(src, 2, stopping=True)) == " ⏹ stopping ranks… "
    st.ranks[1].dropped_spans = 12
    st.rejected = 3
    out = text(statuslines.status(st, live, "waits: rank 1 last"))
    assert out.endswith(" · dropped spans: r1 12 · rejected frames or connections: 3 · waits: rank 1 last")
    rep = types.SimpleNamespace(state="paused", speed=2.0, position_step=5, steps_total=11, name="a.ddptui",
                                loop=True, playing=False, skipped=2, message="")
    assert text(statuslines.replay_state(rep, busy=True)) == (" ⏸ REPLAY  2× · step 5/10 · a.ddptui · loop · seeking…"
                                                             " · 2 invalid frames skipped")


@pytest.mark.asyncio
async def test_a_parts_view_draws_each_line_cut_to_its_width_and_control_characters_as_spaces():
    """PartsView (the status lines' and panels' widget) draws with the Line API: one strip a line, cut
    or padded to the width, in the parts' styles; a newline in a message stays on its line."""
    from textual.app import App

    from ddptui.ui.widgets import PartsView, theme

    class One(App):
        def compose(self):
            yield PartsView(id="v")

    app = One()
    async with app.run_test(size=(30, 4)) as pilot:
        v = app.query_one(PartsView)
        v.styles.height = 3
        v.show([[("rank 1 failed:\nTraceback\t(x)", theme.style(theme.WARN, bold=True))],
                [("x" * 50, theme.style())]])
        await pilot.pause()
        first, second, third = (v.render_line(y) for y in range(3))
        assert first.text == "rank 1 failed: Traceback (x)  " and first.cell_length == 30
        assert any(s.style and s.style.bold for s in first)
        assert second.text == "x" * 29 + "…" and third.text == " " * 30  # (too long: an ellipsis)
        v.show([[("ok", theme.style())]])  # new lines: drawn afresh, not from the strips kept
        assert v.render_line(0).text.startswith("ok ")


def test_a_line_too_long_is_cut_at_a_field_or_word_with_an_ellipsis():
    """At 120x40 the H100 replay's title ended '…naive vs interleave' and the who-waits line
    '(19/2': a line is cut after its last whole field (' · ') or word, then '…'."""
    from ddptui.ui.widgets.text import fit

    waits = [("who waits", "bold"), (" · naive: rank 0 last 75 % · interleaved: rank 1 last 92 % · ddp: rank 0"
                                     " last 67 % · gathering evidence (19/20 steps)", "")]
    assert text(fit(waits, 118)) == ("who waits · naive: rank 0 last 75 % · interleaved: rank 1 last 92 % · ddp: "
                                     "rank 0 last 67 %…")
    assert fit(waits, 200) == waits  # fits: unchanged
    st = SyntheticSource(steps=1, world=2, model="xlarge").store
    title = statuslines.title(st, ["naive", "interleaved", "ddp", "single"])
    cut = text(fit(title, 60))
    assert len(cut) <= 60 and cut.endswith("…") and cut[:-1].rstrip() == cut[:-1]
    assert text(title).startswith(cut[:-1]) and text(title)[len(cut) - 1] == " "  # (at a boundary)
    assert text(fit([("one two three", ""), ("     ", "")], 14)) == "one two three     "  # (spaces: cut as they are)
    assert text(fit([("supercalifragilistic", "")], 8)) == "superca…"  # (one word: cut in it)
