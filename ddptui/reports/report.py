"""Text output of figures: the per-strategy table, speedups and the JSON document."""
from __future__ import annotations

import csv
import json
import sys

from rich.console import Console
from rich.table import Table

from ddptui.model import collectives
from ddptui.model import figures
from ddptui.model import frverdict
from ddptui.model import hang
from ddptui.model import pipeline
from ddptui.model import stragglers
from ddptui.model.gpu import gpu_info, gpu_text, shared_gpu_doc, shared_gpu_note
from ddptui.model.runinfo import simulated_label
from ddptui.model.views import sampling_text


def _f(v, fmt="{:.2f}", na="—"):
    return na if v is None else fmt.format(v)


def run_title(meta: dict) -> str:
    """The title of a run's figures table (live headless, summary, replay --headless)."""
    batch = f" · global batch {meta['batch']}" if meta.get("batch") else f" · global batch unknown{batch_why(meta)}"
    label = simulated_label(meta)
    gpu = gpu_text(meta)
    on = f" · on {gpu}" if gpu else ""
    return (("" if label is None else f"{label} (not measured) · ")
            + f"{meta.get('model')} · {_ranks(meta.get('world'))} · {meta.get('backend') or ''}{on}{batch}")


def _ranks(n) -> str:
    """'1 rank', '2 ranks' ('? ranks' when unknown)."""
    return f"{'?' if n is None else n} rank{'' if n == 1 else 's'}"


def batch_why(meta: dict) -> str:
    """Why a run's global batch is unknown, said after "global batch unknown"."""
    if meta.get("batch_from") == "inputs":  # the ranks looked at the model's inputs
        return (" (no tensor the model was called with had a batch dimension: "
                "ddptui.instrument(model, batch=N) gives it)")
    return " (the ranks did not say)"


def summary_table(rows: list[dict], title: str = "") -> Table:
    t = Table(title=title or None, header_style="bold")
    for col in ("strategy", "ranks", "steps", "step ms (median)", "compute ms", "comm ms",
                "exposed comm ms", "overlap %", "AllReduce/step", "MB/step", "samples/s", "bus GB/s"):
        t.add_column(col, justify="left" if col == "strategy" else "right")
    for r in rows:
        if not r.get("steps"):
            t.add_row(r["strategy"], str(r.get("ranks", "")), "0", *["—"] * 9)
            continue
        t.add_row(r["strategy"], str(r["ranks"]), str(r["steps"]), _f(r["step_ms_median"]),
                  _f(r["compute_ms"]), _f(r["comm_ms"]), _f(r["exposed_comm_ms"]),
                  _f(r["overlap_pct"], "{:.0f}"), _calls(r),
                  _f(r["bytes_per_step"] / 1e6 if r.get("bytes_per_step") is not None else None, "{:.1f}"),
                  _f(r["samples_per_s"], "{:,.0f}"), _f(r.get("bus_bw_gbps"), "{:.2f}"))
    return t


def _calls(r: dict) -> str:
    """AllReduces a step; with other collectives, '3 + 12 coll'."""
    if r.get("collective_calls_per_step") is None:
        return _f(r["allreduce_calls_per_step"], "{:.0f}")
    return f"{r['allreduce_calls_per_step']:.0f} + {r['collective_calls_per_step']:.0f} coll"


def collectives_table(rows: list[dict]) -> Table | None:
    """Every collective of the strategies that issued more than gradient AllReduces, per (op,
    group, phase) (model/collectives.py; the group said unless the default one:
    `all_reduce@tp (forward)`): None when no strategy did."""
    rows = [r for r in rows if r.get("collectives")]
    if not rows:
        return None
    t = Table(title="collectives per step (medians over steps; exposed: not hidden behind compute; "
                    "bus: bytes × ring factor / time)", header_style="bold")
    for col in ("strategy", "collective", "calls/step", "MB/step", "median ms", "ms/step",
                "exposed ms", "exposed %", "bus GB/s", "layers"):
        t.add_column(col, justify="left" if col in ("strategy", "collective") else "right")
    for r in rows:
        for c in r["collectives"]:
            t.add_row(r["strategy"], collectives.row_label(c), _f(c["calls_per_step"], "{:.0f}"),
                      _f(c["bytes_per_step"] / 1e6, "{:.1f}"), _f(c["median_ms"], "{:.3f}"),
                      _f(c["time_ms_per_step"]), _f(c["exposed_ms_per_step"]), _f(c["exposed_pct"], "{:.0f}"),
                      _f(c["bus_bw_gbps"]), str(len(c["layers"])) if c.get("layers") else "—")
    return t


def speedup_lines(sp: dict) -> list[str]:
    out = []
    if "ddp_vs_naive" in sp:
        out.append(f"DDP vs naive speedup: {sp['ddp_vs_naive']:.2f}x")
    for k, v in sp.items():
        if k.endswith("_vs_single"):
            out.append(f"{k.replace('_vs_single', '')} vs single: {v:.2f}x")
    return out


def straggler_line(r: dict) -> str | None:
    """'ddp: rank 1 arrived last in 92 % of steps · wait r0 41.0 ms, r1 0.2 ms (median) ·
    transfer 19.9 ms · culprit rank 1 · fc2 backward +40 ms'; on a device mesh the waits in
    each dimension's collectives after the wait: '· tp r0 1.2, r1 0.3, ... · dp r0 ...'."""
    st = r.get("stragglers")
    if not st:
        return None
    waits = ", ".join(f"r{k} {v:.1f} ms" for k, v in st["wait_ms_median"].items()) \
        if len(st["wait_ms_median"]) <= stragglers.WAITS_LISTED_MAX else stragglers.wait_spread(st["wait_ms_median"])
    who = (f"rank {st['last_arriver_rank']} arrived last in {st['last_arriver_pct']:.0f} % of steps"
           if st["last_arriver_rank"] is not None else "nobody arrived last")
    line = f"{r['strategy']}: {who} · wait {waits} (median)"
    for label, got in (st.get("wait_ms_median_by_group") or {}).items():  # (a device mesh: per dimension)
        line += f" · {label} " + (", ".join(f"r{k} {v:.1f}" for k, v in got.items())
                                  if len(got) <= stragglers.WAITS_LISTED_MAX else stragglers.wait_spread(got))
    line += f" · transfer {st['transfer_ms_median']:.1f} ms"
    ev = st.get("evidence") or {}
    how = (f" (per-layer evidence: {ev['windows_naming_culprit']} of {ev['windows']} windows of "
           f"{ev['window_steps']} steps)") if st.get("culprit_from") == "layers" else ""
    if st.get("culprit"):
        return line + f" · culprit {st['culprit']}{how}"
    if st.get("gathering"):  # too few steps for a verdict (evidence.WINDOW); the run is over
        return line + f" · {stragglers.too_few_text(st)}"
    if r.get("pipeline") is not None:  # (its ranks hold other layers: the pipeline's line names a slow stage)
        return line + " · a pipeline: no layer compared across its stages"
    return line + " · no culprit"


def hta_line(r: dict) -> str | None:
    """'ddp: r0 20.7, r1 25.3' (many ranks: a spread), or None without the figure."""
    got = {k: v for k, v in (r.get("hta_overlap_pct") or {}).items() if v is not None}
    if not got:
        return None
    if len(got) <= stragglers.WAITS_LISTED_MAX:
        return f"{r['strategy']}: " + ", ".join(f"r{k} {v:.1f}" for k, v in got.items())
    vals = sorted((v, int(k)) for k, v in got.items())
    (lo, r_lo), (hi, r_hi) = vals[0], vals[-1]
    return (f"{r['strategy']}: median {vals[len(vals) // 2][0]:.1f} · least r{r_lo} {lo:.1f} · "
            f"most r{r_hi} {hi:.1f} over {len(vals)} ranks")


STALLS_PRINTED = 10  # stalled steps printed per strategy (the JSON lists more)


def stall_lines(r: dict) -> list[str]:
    """'ddp step 6: 8.1 s · rank 0 waited 8.0 s for rank 1 in DDP bucket 0 AllReduce (...)'."""
    rows = r.get("stalls") or []
    out = []
    for x in rows[:STALLS_PRINTED]:
        waited = x["waited_ms"]
        who = (f"rank {next(iter(waited))} waited {next(iter(waited.values())) / 1e3:.1f} s" if len(waited) == 1 else
               f"ranks {', '.join(waited)} waited up to {max(waited.values()) / 1e3:.1f} s")
        out.append(f"{r['strategy']} step {x['step']}: {x['step_ms'] / 1e3:.1f} s · {who} for rank "
                   f"{x['waited_for']} in {x['collective']}")
    more = len(rows) - len(out) + int(r.get("stalls_not_listed") or 0)
    if more:
        out.append(f"{r['strategy']}: {more} more stalled step(s) (the JSON's `stalls` lists up to 100)")
    return out


BUCKET_TIMING_TEXT = {
    "flight-recorder": "buckets timed by NCCL's own timing (PyTorch's Flight Recorder), no Python on their path",
    "comm-hook": "buckets timed by ddptui's comm hook",
    "mixed": "buckets timed by NCCL's own timing on some ranks, by ddptui's comm hook on others",
}


def print_summary(rows: list[dict], meta: dict, file=None, title: str = "") -> None:
    out = file or sys.stdout
    console = Console(file=file, width=None if out.isatty() else 160)
    console.print(summary_table(rows, title))
    colls = collectives_table(rows)
    if colls is not None:
        console.print(colls)
    for line in speedup_lines(figures.speedups(rows)):
        console.print(line)
    marks = [(r.get("strategy", "?"), r["layer_marks"]) for r in rows if r.get("layer_marks")]
    if len(marks) == 1:  # layer marks on a sample of steps: said, with the period, and why once
        s, lm = marks[0]
        console.print(f"{s}: {sampling_text((lm['steps_marked'], lm['steps']), period=lm.get('every'))}: "
                      f"{lm['why']}", markup=False, highlight=False)
    elif marks:
        console.print(f"{marks[0][1]['why']}:", markup=False, highlight=False)
        for s, lm in marks:
            console.print(f"  {s}: {sampling_text((lm['steps_marked'], lm['steps']), period=lm.get('every'))}",
                          markup=False, highlight=False)
    for r in rows:
        bt = r.get("bucket_timing")
        if bt:
            console.print(f"{r.get('strategy')}: {BUCKET_TIMING_TEXT.get(bt['by'], bt['by'])}"
                          + (f"; {bt['untimed']} bucket AllReduces not covered by it (drawn as moments)"
                             if bt.get("untimed") else ""), markup=False, highlight=False)
    for r in rows:
        cg = r.get("cuda_graph_marks")
        if cg:
            console.print(f"{r.get('strategy')}: {sum(cg['skipped'].values())} layer marks skipped "
                          f"{cg['why']}: the layers inside it have no spans in its replays "
                          "(docs/compiled.md)", markup=False, highlight=False)
        tc = r.get("traced_collectives")
        if tc:
            what = ", ".join(f"{op} ×{v['per_step']:g}" for op, v in tc.items())
            console.print(f"{r.get('strategy')}: collectives inside compiled graphs, a step: {what}: "
                          "torch.compile traced them into its graph, counted, not timed "
                          "(docs/compiled.md)", markup=False, highlight=False)
    for r in rows:
        pp = r.get("pipeline")
        if pp:  # a pipeline's bubble beside its schedule's plan (model/pipeline.py)
            console.print(pipeline.line(r.get("strategy", "?"), pp), markup=False, highlight=False)
    hta = [x for x in (hta_line(r) for r in rows) if x]
    if hta:
        console.print("overlap % per rank as HTA computes it (every step but the last, warm-up "
                      "included; the table's: the median step after the warm-up, mean of the ranks):",
                      markup=False, highlight=False)
        for line in hta:
            console.print("  " + line, markup=False, highlight=False)
    waits = [x for x in (straggler_line(r) for r in rows) if x]
    if waits:
        console.print("who waits for whom (per collective: last arriver's ready - own ready; transfer: end - last ready):")
        for line in waits:
            console.print("  " + line, markup=False, highlight=False)
    stalls = [x for r in rows for x in stall_lines(r)]
    if stalls:
        console.print(f"stalled steps (a rank waited {hang.STALL_S:.0f} s or more inside one collective):",
                      markup=False, highlight=False)
        for line in stalls:
            console.print("  " + line, markup=False, highlight=False)


def print_flight_recorder(fr: dict, meta: dict, file=None) -> None:
    """Flight Recorder dumps' report (model/frverdict.py): what was read, then the verdict; of
    an attached job's recording, what its polls named."""
    out = file or sys.stdout
    if fr.get("source") == "attach":  # (`ddptui attach`: what its polls named, ddptui/live/attach.py)
        print(f"attached to {fr.get('attached_to')} · {_ranks(meta.get('world'))} · "
              f"{fr.get('backend') or 'backend unknown'} · {fr.get('polls', 0)} polls of their Flight Recorders",
              file=out)
        lines = fr.get("lines") or [fr.get("verdict", "")]
        print(f"verdict: {lines[0]}", file=out)
        for line in lines[1:]:
            print(line, file=out)
        for n in fr.get("named") or ():
            after = n.get("named_after_s")
            print(f"named: {n.get('kind')} {n.get('label')} {n.get('collective')}"
                  + (f", {after:.1f} s after it began" if isinstance(after, (int, float)) else "")
                  + "".join(f"; rank {r} at {s.get('where')}" for r, s in (n.get("stacks") or {}).items()
                            if isinstance(s, dict) and s.get("where")), file=out)
        for r in fr.get("resolved") or ():
            print(f"resolved: {r.get('label')} {r.get('collective')} went on after {r.get('after_s')} s", file=out)
        out.flush()
        return
    dumps = fr.get("dumps") or {}
    versions = sorted({d.get("version") for d in dumps.values() if d.get("version")})
    entries = sum(int(d.get("entries") or 0) for d in dumps.values())
    p2p = sum(int(d.get("p2p_entries") or 0) for d in dumps.values())  # (sends and recvs: not collectives)
    print(f"Flight Recorder dumps · {_ranks(meta.get('world'))} ({len(dumps)} dumped) · "
          f"{fr.get('backend') or 'backend unknown'} · {len(fr.get('groups') or ())} process group(s) · "
          f"{entries - p2p} collectives" + (f" + {p2p} sends and recvs" if p2p else "")
          + f" · files {fr.get('prefix')}<rank>"
          + (f" · format {', '.join(versions)}" if versions else ""), file=out)
    lines = fr.get("lines") or [fr.get("verdict", "")]
    print(f"verdict: {lines[0]}", file=out)
    for line in lines[1:]:
        print(line, file=out)
    for note in fr.get("notes") or ():
        print(f"note: {note}", file=out)
    out.flush()


def json_doc(rows: list[dict], meta: dict, extra: dict | None = None) -> dict:
    doc = {
        "model": meta.get("model"), "world_size": meta.get("world"), "batch": meta.get("batch"),
        # "inputs": the batch dimension of what the ranks' model was called with, summed
        "batch_from": meta.get("batch_from"),
        "backend": meta.get("backend"), "device": meta.get("device"), "torch": meta.get("torch"),
        "gpu": gpu_info(meta),  # the GPUs it ran on: name, count, ranks (None: on CPU)
        "strategies": rows, "speedup": figures.speedups(rows),
        "layers": list(meta.get("layers") or []),  # forward order
    }
    if extra:
        doc.update(extra)
    label = simulated_label(meta)
    if label is not None:  # (after extra: nothing replaces it)
        sim = meta.get("simulated")
        doc["simulated"] = dict(sim, label=label) if isinstance(sim, dict) else {"label": label}
    return doc


def write_json(path: str, doc: dict) -> None:
    """`doc` as JSON to `path`, or to stdout when it is "-"."""
    if path == "-":
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        sys.stdout.flush()
        return
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


def report_run(store, json_path: str | None, extra, *, title: str | None = None, out=None, err=None,
               notes=(), empty: str | None = None, when: str = "", recording: str | None = None) -> None:
    """The one report of a run's figures, live (`--headless`) or recorded (summary, replay
    --headless): `notes` (warnings about the source) on err, the table on out (or the
    `empty` warning when no step is complete), the dropped spans (`when`: during what), and
    the JSON document, whose run fields are `extra(dropped spans)`; `json_path` "-": the
    JSON on stdout, the text on err. `recording`: the file the commands it suggests name."""
    err = err or sys.stderr
    out = err if json_path == "-" else out or sys.stdout
    rows = store.summaries()
    meta = store.meta.as_dict()
    ranks = store.rank_snapshot()
    if ranks and not meta.get("backend"):
        meta["backend"] = ranks[min(ranks)].backend
    for note in notes:
        print(f"ddptui: warning: {note}", file=err, flush=True)
    fr = frverdict.of_run(store.meta)  # (Flight Recorder dumps: the verdict, no step figures)
    if fr is not None:
        rows = []
        print_flight_recorder(fr, meta, file=out)
    elif any(r.get("steps") for r in rows):
        head = title or run_title(meta)
        label = simulated_label(meta)
        if label is not None and label not in head:  # (a title given: the label still leads)
            head = f"{label} (not measured) · {head}"
        print_summary(rows, meta, file=out, title=head)
        shared = shared_gpu_doc(meta, rows, recording)
        for why in shared_gpu_note(meta, rows)[:1]:  # (ranks sharing one GPU over gloo)
            print(f"why comm dwarfs compute: {why}; this run's own steps at NVLink's bus: "
                  f"{shared['commands'][1]}", file=out, flush=True)
    elif empty:
        print(f"ddptui: warning: {empty}", file=err, flush=True)
    memory = memory_doc(ranks)
    if memory and any(r.get("steps") for r in rows):
        print(memory_line(memory), file=out, flush=True)
    dropped = sum(i.dropped_spans for i in ranks.values())
    if dropped:
        print(f"ddptui: warning: {dropped} spans were dropped{when} (the app could not keep up)",
              file=err, flush=True)
    if json_path:
        doc = json_doc(rows, meta, extra(dropped))
        if fr is not None:
            doc["flight_recorder"] = fr
        if memory:
            doc["memory"] = memory
        shared = shared_gpu_doc(meta, rows, recording)
        if shared is not None:
            doc["shared_gpu"] = shared  # why comm dwarfs compute (ranks sharing one GPU over gloo)
        write_json(json_path, doc)


def memory_doc(ranks: dict) -> dict:
    """Per rank (a user's model: its hello says it), the bytes of training state it holds
    after its first step, and what a replica of everything (DDP) would hold."""
    out = {}
    for r, info in sorted(ranks.items()):
        m = getattr(info, "memory", None)
        if not m:
            continue
        held, grads, opt, full = m
        scale = full / held if held else 1.0  # (a shard's optimizer state, as a whole replica's)
        out[str(r)] = {"params_bytes": held, "grads_bytes": grads, "optimizer_bytes": opt,
                       "model_params_bytes": full,
                       "replicated_bytes": int(full + full + opt * scale),
                       "peak_bytes": getattr(info, "mem_peak", None)}
    return out


def memory_line(memory: dict) -> str:
    """One line of what each rank holds (the largest, when they differ)."""
    r, m = max(memory.items(), key=lambda kv: kv[1]["params_bytes"] + kv[1]["optimizer_bytes"])
    mb = 1024 * 1024
    held = m["params_bytes"] + m["grads_bytes"] + m["optimizer_bytes"]
    part = (f"parameters {m['params_bytes'] / mb:.1f} of {m['model_params_bytes'] / mb:.1f} MB held"
            if m["params_bytes"] < m["model_params_bytes"] else f"parameters {m['params_bytes'] / mb:.1f} MB")
    line = (f"memory per rank (rank {r}, after its first step): {part}, gradients "
            f"{m['grads_bytes'] / mb:.1f} MB, optimizer state {m['optimizer_bytes'] / mb:.1f} MB: "
            f"{held / mb:.1f} MB")
    if m["params_bytes"] < m["model_params_bytes"]:
        line += f" (a full replica, as DDP holds: {m['replicated_bytes'] / mb:.1f} MB)"
    if m.get("peak_bytes"):
        line += f"; allocator peak {m['peak_bytes'] / mb:.0f} MB"
    return line


def _params(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n:,}"


def print_bench_tables(rows: list[dict], infos: list[dict], header: str, file=None) -> None:
    """`ddptui bench`'s tables: measured figures, the cost model, the Amdahl ceiling."""
    con = Console(file=file or sys.stdout, width=160)
    t = Table(title=header, header_style="bold")
    for col in ("model", "strategy", "ranks", "params", "step ms (median)", "comm ms",
                "samples/s", "speedup vs single"):
        t.add_column(col, justify="left" if col in ("model", "strategy") else "right")
    last = None
    for r in rows:
        if last is not None and r["model"] != last:
            t.add_section()
        last = r["model"]
        t.add_row(r["model"], r["strategy"], str(r["ranks"]), _params(r["params"]),
                  _f(r["step_ms_median"]),
                  "—" if r["strategy"] == "single" else _f(r["comm_ms"]),
                  _f(r["samples_per_s"], "{:,.0f}"), _f(r["speedup_vs_single"], "{:.2f}×"))
    con.print(t)

    c = Table(title="cost model (seed 001): bytes/rank/step = 2(N−1)/N × params × 4 B (fsdp: 3(N−1)/N); "
                    "predicted comm = bytes / bus bandwidth", header_style="bold")
    for col in ("model", "strategy", "AllReduce/step", "MB/rank/step", "bus GB/s (this)",
                "bus GB/s (best)", "predicted comm ms", "measured comm ms", "exposed comm ms"):
        c.add_column(col, justify="left" if col in ("model", "strategy") else "right")
    last = None
    for r in rows:
        if r["strategy"] == "single":
            continue
        if last is not None and r["model"] != last:
            c.add_section()
        last = r["model"]
        c.add_row(r["model"], r["strategy"], _f(r["allreduce_calls_per_step"], "{:.0f}"),
                  _f(r["ring_bytes_per_rank_per_step"] / 1e6, "{:.2f}"), _f(r["bus_bw_gbps"]),
                  _f(r["model_bus_bw_gbps"]), _f(r["predicted_comm_ms"]), _f(r["comm_ms"]),
                  _f(r["exposed_comm_ms"]))
    con.print(c)

    a = Table(title="Amdahl (seed 002): f = T_single / (T_single + T_comm naive); "
                    "ceiling = 1 / ((1 − f) + f / N)", header_style="bold")
    for col in ("model", "ranks", "T_single ms", "T_comm naive ms", "f", "ceiling",
                "achieved (best)", "of ceiling"):
        a.add_column(col, justify="left" if col == "model" else "right")
    for m in infos:
        best = (f"{m['best_speedup']:.2f}× {m['best_strategy']}" if m.get("best_speedup") else "—")
        eff = (m["best_speedup"] / m["amdahl_ceiling"]
               if m.get("best_speedup") and m.get("amdahl_ceiling") else None)
        a.add_row(m["model"], str(m["ranks"]), _f(m["t_single_ms"]), _f(m["t_comm_naive_ms"]),
                  _f(m["amdahl_f"], "{:.3f}"), _f(m["amdahl_ceiling"], "{:.2f}×"), best,
                  _f(eff * 100 if eff is not None else None, "{:.0f}%"))
    con.print(a)
    notes = [m for m in infos if m.get("amdahl_f") is None]
    for m in notes:
        con.print(f"{m['model']}: no Amdahl ceiling (needs single and naive measured)")


def write_csv(path: str, rows: list[dict], fields) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})
