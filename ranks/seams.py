"""The test seams: environment variables through which tests bend production code.

Every one is read here and nowhere else, at call time (tests set them in a subprocess's
environment, or in-process with monkeypatch). Production code never sets any of them: unset
(or empty), each is off and the code runs as it would without the seam. This module imports
only the standard library: the ranks import it early in each worker, and `ranks` never
imports `ddptui` (the app reads its seams from here too).

- ``DDPTUI_CLOCK_SKEW_NS`` (`clock_skew_ns`): ns added to every reading of the ranks' clock
  (`ranks.clock.now_ns`, read once when it is imported), so that two "hosts" on one machine
  have different clocks. Not an int: 0. Used by tests/test_multinode.py
  (`test_two_nodes_one_corrected_axis`, through `_env(skew=...)`).
- ``DDPTUI_NET_ASYM_NS`` (`net_asym_ns`): `ddptui join` stamps each of node 0's clock pings
  this much later (an asymmetric path no exchange can see; the refinement from collectives
  corrects it). Negative or not an int: 0. Read once when ddptui.cli.join is imported. Used
  by tests/test_multinode.py (`test_two_nodes_one_corrected_axis`, "+250ms-asymmetric-path").
- ``DDPTUI_SOCKET_SNDBUF`` (`socket_sndbuf`): the kernel send buffer of a rank's socket to
  the app (`ranks.core.emitter.Emitter`), small so that a stalled app's backlog overflows at once.
  Not an int: ValueError. Used by tests/test_faults.py
  (`test_app_stalled_training_goes_on_and_drops_are_counted`).
- ``DDPTUI_VERIFY_SHIFT`` (`verify_shift`): e.g. ``backward:3,step:1``: the worker moves its
  spans of those kinds later by that many ms (`ranks.builtin.profwin.parse_shift`; ``naive/forward:1``:
  that strategy's only), so that `ddptui verify` must fail naming them. Used by tests/test_verify.py
  (`test_verify_fails_naming_a_shifted_kind`, `test_verify_a_compiled_model_passes_and_a_shifted_forward_fails`).
- ``DDPTUI_SYNC_DEBUG`` (`sync_debug`): a directory; on CUDA the worker turns torch.cuda's
  sync debug mode on inside measured steps and writes every host-device synchronize it saw
  there (`ranks.builtin.worker.SyncProbe`). Used by the GPU pass, benchmarks/gpu_pass.sh (no pytest
  test: it needs a GPU).
- ``DDPTUI_TAB_STALL_S`` (`tab_stall_s`): seconds a `ddptui serve` tab whose output is
  blocked waits before it exits (default 30, at least 1; not a number: 30). Read once when
  ddptui.cli.serve is imported. Used by tests/test_doors.py (the `serve` fixture,
  `test_a_stalled_websocket_ends_its_tab`).
- ``DDPTUI_GPU_COUNT`` (`gpu_count`): the CUDA devices a run may use, instead of asking NVML
  (`ddptui.live.launcher.detect_gpus`; negative: 0, not an int: ValueError); also for
  machines without NVML. Used by tests/conftest.py (``0`` for the whole session and what it
  starts, but in tests marked gpu: every other test means CPU ranks, also on a machine with one
  GPU, where `--gpus 2` would be refused; the suite passes with ``1`` set for the whole run on
  a machine without CUDA), tests/test_cli_verbs.py, tests/test_verify.py (``0``: CPU ranks)
  and tests/test_pipeline.py (`test_more_gpus_than_exist`).
- ``DDPTUI_CONTROL_GAP_S`` (`control_gap_s`): seconds the workers' control collective is
  spread to (`ranks.builtin.worker.control_interval`; default 0.02), large so that two CPU ranks,
  whose iterations take tens of ms, skip it for many iterations as short GPU steps would. Not
  a positive number: the default. Used by tests/test_layer_sampling.py
  (`test_ranks_agree_on_the_steps_whose_layers_they_mark`).
- ``DDPTUI_FR_STANDIN`` (`fr_standin`): on CPU (gloo), the ddp strategy takes the path of
  NCCL's own timing (`ranks.builtin.strategies.comm_timing_for`: no comm hook, buckets timed from the
  Flight Recorder) with gloo's real Flight Recorder as the stand-in for NCCL's: its entries as
  torch records them, each given the state and the GPU duration NCCL's would have
  (`ranks.core.flightrec.gloo_standin_dump`, the value in ms; "1": 0.2), a step's entries
  waited for up to 10 s (a loaded CPU holds gloo's threads). Needs TORCH_FR_BUFFER_SIZE.
  Used by tests/test_flightrec.py (`test_buckets_stay_timed_after_ddp_is_wrapped_again_for_a_new_cap`).
- ``DDPTUI_GRAPH_CAPTURE`` (`graph_capture`): ``1``: every layer mark an op of a compiled
  graph runs (ranks.core.markop) finds its stream capturing a CUDA graph, as under
  `mode="reduce-overhead"` on a GPU, so that the marks are skipped and counted, not recorded
  into the graph (read once when ranks.core.markop is imported); ``rank:N``: on rank N only.
  Used by tests/test_compiled.py (`test_marks_inside_a_cuda_graph_capture_are_skipped_and_said`,
  on rank 1 of a compiled DDP module's run whose rank 0 is timed).
- ``DDPTUI_DDP_LAYOUT_HIDDEN`` (`ddp_layout_hidden`): ``1``: on the path of NCCL's own timing,
  a user's DDP reports no bucket layout (`ranks.scripts.user.Handle.fr_layout` reads none), as
  a torch whose DDP reports it in another form would, so that its buckets are handed to
  ddptui's comm hook after its first steps (`Handle.fr_give_up`). Used by
  tests/test_flightrec.py (`test_a_ddp_whose_layout_cannot_be_read_goes_to_the_comm_hook_and_says_so`).

Configuration read from the environment (DDPTUI_SOCKET, DDPTUI_TOKEN, DDPTUI_RECORD,
DDPTUI_RUNS_DIR, DDPTUI_AUTO, DDPTUI_LAYERS) is not a seam: production code sets or documents
it, and it is read where it is used.
"""
from __future__ import annotations

import os


def clock_skew_ns() -> int:
    """DDPTUI_CLOCK_SKEW_NS: ns added to the ranks' clock (0: none)."""
    try:
        return int(os.environ.get("DDPTUI_CLOCK_SKEW_NS", "0") or 0)
    except ValueError:
        return 0


def net_asym_ns() -> int:
    """DDPTUI_NET_ASYM_NS: ns a join stamps node 0's pings late (0: none)."""
    try:
        return max(0, int(os.environ.get("DDPTUI_NET_ASYM_NS", "0") or 0))
    except ValueError:
        return 0


def socket_sndbuf() -> int | None:
    """DDPTUI_SOCKET_SNDBUF: a rank's socket send buffer in bytes (None: the kernel's)."""
    sndbuf = os.environ.get("DDPTUI_SOCKET_SNDBUF")
    return int(sndbuf) if sndbuf else None


def verify_shift() -> str | None:
    """DDPTUI_VERIFY_SHIFT: 'kind:ms,...' spans to shift, unparsed (None: none)."""
    return os.environ.get("DDPTUI_VERIFY_SHIFT") or None


def sync_debug() -> str | None:
    """DDPTUI_SYNC_DEBUG: the directory of the CUDA sync probe's output (None: no probe)."""
    return os.environ.get("DDPTUI_SYNC_DEBUG") or None


def tab_stall_s() -> float:
    """DDPTUI_TAB_STALL_S: seconds a serve tab's output may stay blocked (30 by default)."""
    try:
        return max(1.0, float(os.environ.get("DDPTUI_TAB_STALL_S", "") or 30.0))
    except ValueError:
        return 30.0


def gpu_count() -> int | None:
    """DDPTUI_GPU_COUNT: the CUDA devices a run may use (None: ask NVML)."""
    env = os.environ.get("DDPTUI_GPU_COUNT")
    return None if env is None else max(0, int(env))


def control_gap_s(default: float) -> float:
    """DDPTUI_CONTROL_GAP_S: seconds between the workers' control collectives (`default`)."""
    try:
        got = float(os.environ.get("DDPTUI_CONTROL_GAP_S", "") or default)
    except ValueError:
        return default
    return got if got > 0 else default


def fr_standin() -> float | None:
    """DDPTUI_FR_STANDIN: the stand-in's duration in ms of every collective (None: off)."""
    v = os.environ.get("DDPTUI_FR_STANDIN")
    if not v:
        return None
    try:
        ms = float(v)
    except ValueError:
        return None
    return 0.2 if ms == 1 else ms if ms > 0 else None


def ddp_layout_hidden() -> bool:
    """DDPTUI_DDP_LAYOUT_HIDDEN=1: a user's DDP reports no bucket layout (NCCL's own timing)."""
    return os.environ.get("DDPTUI_DDP_LAYOUT_HIDDEN", "") == "1"


def graph_capture() -> bool:
    """DDPTUI_GRAPH_CAPTURE=1: markop's marks see a capturing stream (a CUDA graph's); ``rank:N``:
    on rank N only (RANK), the others' marks run."""
    v = os.environ.get("DDPTUI_GRAPH_CAPTURE", "")
    if v.startswith("rank:"):
        return v[5:].strip().isdigit() and int(v[5:]) == int(os.environ.get("RANK") or -1)
    return v == "1"
