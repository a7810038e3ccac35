"""The headline: within 80 columns for every combination of figures, and honest."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len

from ddptui.ui.widgets.headline import headline

ratio = st.floats(min_value=1e-3, max_value=1e4, allow_nan=False, allow_infinity=False)
pct = st.one_of(st.none(), st.floats(min_value=0, max_value=100, allow_nan=False))


@settings(max_examples=400, deadline=None)
@given(ddp=st.one_of(st.none(), ratio), singles=st.dictionaries(st.sampled_from(["naive", "interleaved", "ddp"]), ratio),
       overlap=st.dictionaries(st.sampled_from(["naive", "interleaved", "ddp", "single"]), pct),
       width=st.integers(min_value=20, max_value=80))
def test_headline_fits_and_tells_the_truth(ddp, singles, overlap, width):
    sp = {f"{k}_vs_single": v for k, v in singles.items()}
    if ddp is not None:
        sp["ddp_vs_naive"] = ddp
    text, verdict = headline(sp, overlap, width)
    assert cell_len(text) <= width and "\n" not in text
    if ddp is not None and width == 80:
        if ddp < 0.995:
            assert "slower" in text and verdict == "bad" and "faster" not in text
        elif ddp > 1.005:
            assert "faster" in text and verdict == "good"
        assert f"{ddp:.2f}×" in text


@settings(max_examples=200, deadline=None)
@given(ddp=st.one_of(st.none(), ratio), overlap=st.dictionaries(st.sampled_from(["naive", "ddp"]), pct),
       width=st.integers(min_value=20, max_value=160), k=st.integers(min_value=0, max_value=19))
def test_gathering_evidence_is_said_where_it_fits_and_never_as_a_verdict(ddp, overlap, width, k):
    """No verdict before a full window: the note ('gathering evidence (k/20 steps)') follows
    the sentence the headline would show without it, when it fits, and never costs the
    figures their room or reads as 'slow'."""
    sp = {} if ddp is None else {"ddp_vs_naive": ddp}
    note = f"gathering evidence ({k}/20 steps)"
    plain, verdict = headline(sp, overlap, width)
    text, verdict2 = headline(sp, overlap, width, "", note)
    assert cell_len(text) <= width and verdict2 == verdict and "slow:" not in text
    assert text in (plain, f"{plain} · {note}")


def test_a_share_hidden_alone_is_good_only_from_half():
    """Told alone, most of the communication exposed (a tensor-parallel all_reduce waited on in
    its layer, gloo's blocking collectives) is not green: a warning under half, good from it."""
    from ddptui.ui.widgets.headline import candidates
    assert candidates({}, {"fsdp": 8.0})[0] == ("FSDP hides 8 % of its communication behind compute", "same")
    assert candidates({}, {"fsdp": 60.0})[0][1] == "good"
    assert candidates({}, {"ddp": 20.0})[0] == ("DDP hides 20 % of its communication behind backward", "same")
    assert candidates({}, {"ddp": 75.0})[0][1] == "good"


def test_the_legend_keeps_the_waits_at_80_columns():
    """A compute lane with waits on screen: its colour stays in the legend at 80 columns, beside
    every collective's (the passes and the waits said short, as the lanes label them)."""
    from ddptui.ui.widgets import statuslines, theme
    parts = statuslines.legend(4.23, 1, 80, {"all_reduce", "all_gather", "reduce_scatter"}, allreduce=False, waits=True)
    text = "".join(t for t, _ in parts)
    assert len(text) <= 80 and " wait " in text and " AG " in text and " RS " in text and " AR " in text, text
    wide = "".join(t for t, _ in statuslines.legend(4.23, 1, 200, {"all_gather"}, allreduce=False, waits=True))
    assert "compute waits" in wide and "forward" in wide
    assert theme.LANE_COLOURS[theme.COMPUTE_WAIT] not in (theme.LANE_COLOURS[theme.WAIT], theme.LANE_COLOURS[theme.OTHER])
