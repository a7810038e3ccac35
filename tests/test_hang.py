"""A hang named from the ranks' heartbeats (ddptui.model.hang.stall), pure: which collective is
THE one (the one most stuck ranks are inside), who is inside it, who never entered it and who
went past it; a pipeline's send or receive said with its microbatch, direction and peer.
(Found missing by tests/mutation_check.py: a hang named for the collective fewest ranks were
inside passed every test.)"""
from __future__ import annotations

from ddptui.model import hang
from ddptui.model.store.rankinfo import RankInfo

S = 1_000_000_000


def rank(r: int, waiting=None, entered=None, p2p=None, hb_s=10.0) -> RankInfo:
    info = RankInfo(r)
    info.waiting, info.colls_entered, info.waiting_p2p = waiting, entered, p2p
    info.hb_ts = int(hb_s * S)
    return info


def test_the_collective_most_stuck_ranks_are_inside_is_the_one():
    """Ranks 0 and 1 have been inside all_gather #17 for 6 s, rank 2 inside broadcast #18 for
    5 s (it went past #17), rank 3 inside none with fewer entered (it never entered it): the
    hang is the all_gather, not the broadcast (one rank), and each other rank is said where it is."""
    ag = ("all_gather", 17, 12_600_000, 2, 4 * S)
    ranks = {0: rank(0, ag, 40), 1: rank(1, ag, 40),
             2: rank(2, ("broadcast", 18, 4, -1, 5 * S), 41), 3: rank(3, None, 38)}
    got = hang.stall(ranks, ["fc1", "fc2", "h.3"])
    assert (got.op, got.seq, got.layer) == ("all_gather", 17, "h.3"), got
    assert got.inside == {0: 6.0, 1: 6.0}, got.inside
    assert list(got.past) == [2] and "inside broadcast #18" in got.past[2], got.past
    assert list(got.never) == [3] and got.never[3].startswith("inside no collective; 38 entered, 40 by those inside"), got.never
    assert got.text().startswith("ranks 0, 1 inside all_gather #17 (12.6 MB, h.3) for 6 s; "), got.text()


def test_no_hang_until_a_rank_has_been_inside_one_for_the_stall_time():
    ranks = {0: rank(0, ("all_reduce", 3, 4, -1, int(8 * S)), 3), 1: rank(1, None, 3)}
    assert hang.stall(ranks, []) is None  # (2 s inside: under STALL_S)


def test_a_pipelines_receive_is_said_with_its_microbatch_and_peer():
    """Rank 1 (stage 1) stands in a receive of microbatch 2's activations from rank 0, which is
    inside no collective: said in a pipeline's words, in the line and in the short form."""
    ranks = {0: rank(0, None, 25), 1: rank(1, ("recv", 27, 16_384, -1, 6 * S), 27, ("forward", 0, 1, 2))}
    got = hang.stall(ranks, [])
    assert got.collective() == "recv #27 of microbatch 2's activations from rank 0 (stage 1) (16,384 B)", got.collective()
    assert "rank 0 never entered it (inside no collective; 25 entered, 27 by those inside)" in got.text(), got.text()
    assert got.short().startswith("stuck in RECV #27 (mb 2 from r0): r1 inside 4 s"), got.short()
