"""`ddptui whatif FILE --bucket-cap 1,5,25,100 [--world 2,4,8] [--bus-gbps X] [--json PATH]`:
DDP's step under another bucket cap, world size or network, predicted from a recording
(ddptui.model.whatif), next to what the recording measured under the same settings.

Exit status: 0 with predictions; 2 for a bad command line, a bad file, or a recording with
nothing to predict from (one line on stderr: `ddptui: error: ...`).
"""
from __future__ import annotations

import argparse
import json
import sys

from ranks import spec

from ddptui.model import pipewhatif
from ddptui.model import whatif as whatif_model
from .common import CliError, JSON_METAVAR, Parser, json_target
from .options import NUMERIC, add_numeric

EPILOG = """\
Predictions, not measurements: the simulator replays the recorded steps (each rank's
backward, when each collective was ready) under DDP's bucketing at each cap, with collective
time = alpha + beta x bytes fitted to the recording's own collectives (fit error printed),
and contention fitted from the recording too: how much a collective overlapping the backward
slows it (each layer's backward with and without one), and how much compute slows a
collective (alpha and beta from collectives with no compute under them); a recorded backward is replayed without the slowdown its own overlap caused,
plus the slowdown of the overlap the new plan gives it (--no-contention: as recorded).
--call-us adds a per-call host cost on the thread that issues each collective (benchmark
P9c fits one to seed 002's naive A100 runs: ~86 µs), taken out of alpha.
--world scales collectives by the ring's 2(N-1)/N; --bus-gbps sets the bus bandwidth
instead of the fitted beta. World-size and bandwidth predictions are unchecked until a GPU
run checks them.

A pipeline's recording (torch.distributed.pipelining, GPipe or 1F1B) is predicted at other
microbatch counts (--microbatches; the same global batch) and schedules (--schedule):
GPipe and 1F1B as torch's code runs them, interleaved 1F1B and looped BFS with
--virtual-stages stages a rank (each rank's recorded stage cut into that many of equal
work). Each row: the step, each stage's bubble % (the share of the step it computes
nothing), and the plan's bubble for that schedule, (p-1)/(V·m+p-1). docs/pipelines.md.

examples:
  ddptui whatif demo/cpu-medium-2ranks.ddptui --bucket-cap 1,5,25,100
  ddptui whatif run.ddptui --world 2,4,8,16,32,64 --bus-gbps 50 --json whatif.json
  ddptui whatif pipe4.ddptui --and pipe8.ddptui --schedule 1f1b,interleaved1f1b --virtual-stages 4
"""


def _list(name: str, conv):
    def parse(text: str) -> list:
        items = [x.strip() for x in text.split(",") if x.strip()]
        if not items:
            raise ValueError(f"{name} is empty")
        out = []
        for x in items:
            v = conv(x)
            if v not in out:
                out.append(v)
        return out

    def wrapped(text: str):
        try:
            return parse(text)
        except (ValueError, argparse.ArgumentTypeError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return wrapped


def parser() -> Parser:
    p = Parser(prog="ddptui whatif", epilog=EPILOG,
                description="Predict DDP's step time, exposed communication and overlap under other "
                            "bucket caps, world sizes or bus bandwidths from one recording; a pipeline's "
                            "step and bubble at other microbatch counts and schedules.",
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE", help="a .ddptui recording (or a directory of rank<r>.ddptui)")
    p.add_argument("--bucket-cap", metavar="MB,...",
                   type=_list("--bucket-cap", NUMERIC["--bucket-cap"].converter("--bucket-cap")),
                   help="DDP bucket caps to predict, in MB (default the ladder "
                        + ",".join(f"{c:g}" for c in spec.BUCKET_LADDER_MB) + " unless --world is given; "
                        "a recording without ddp steps: world sizes 2,4,8 instead)")
    p.add_argument("--world", metavar="N,...", type=_list("--world", NUMERIC["--world"].converter("--world")),
                   help="world sizes to predict, every strategy that communicates (e.g. 2,4,8,16,32,64)")
    add_numeric(p, "--bus-gbps", metavar="X", default=None,
                help="bus bandwidth in GB/s (nccl-tests' busbw) instead of the fitted beta")
    add_numeric(p, "--hop-us", metavar="US", default=None,
                help="latency of one ring step in µs (a collective at N ranks pays 2(N-1) of them) "
                     "instead of the fitted alpha's share")
    add_numeric(p, "--call-us", metavar="US", default=None,
                help="per-call host cost in µs, spent on the thread that issues each collective "
                     "(delays the backward after it), taken out of the fitted alpha")
    p.add_argument("--no-contention", action="store_true",
                   help="replay the recorded backward as is (no slowdown of compute and collectives "
                        "where they overlap)")
    p.add_argument("--from-cap", metavar="MB", default=None,
                   type=NUMERIC["--bucket-cap"].converter("--from-cap"),
                   help="predict from the ddp steps run with this cap (default the cap in force last)")
    p.add_argument("--strategy", choices=[s for s in spec.STRATEGIES if s != "single"],
                   help="only this strategy (default: every one that communicates)")
    p.add_argument("--microbatches", metavar="M,...", type=_list("--microbatches", _positive_int),
                   help="a pipeline's recording: microbatch counts to predict, the same global batch (default "
                        "half, the same, twice and four times the recorded)")
    p.add_argument("--and", dest="and_file", metavar="FILE",
                   help="a pipeline's recording: the same pipeline recorded at another microbatch count (a "
                        "microbatch's fixed cost, whatever its size, fitted from the two)")
    p.add_argument("--schedule", metavar="S,...", type=_list("--schedule", _schedule),
                   help="a pipeline's recording: schedules to predict, from " + ", ".join(pipewhatif.ALL)
                        + " (default " + ", ".join(pipewhatif.DEFAULT) + "; the last two: several stages a "
                        "rank, --virtual-stages)")
    p.add_argument("--virtual-stages", metavar="V", type=NUMERIC["--virtual-stages"].converter("--virtual-stages"),
                   default=None,
                   help=f"a pipeline's recording: stages a rank for interleaved1f1b and loopedbfs, each rank's "
                        f"recorded stage cut into V of equal work (default {pipewhatif.VIRTUAL})")
    p.add_argument("--json", metavar=JSON_METAVAR, help="also write the predictions as JSON to PATH (-: the JSON alone, on stdout)")
    return p


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise ValueError(f"--microbatches: {text!r} is not a whole number") from None
    if not 1 <= v <= 4096:
        raise ValueError(f"--microbatches: {v} is not between 1 and 4096")
    return v


def _schedule(text: str) -> str:
    if text not in pipewhatif.ALL:
        raise ValueError(f"--schedule: {text!r} is not one of {', '.join(pipewhatif.ALL)}")
    return text


def pipeline_main(a, got) -> int:
    """`ddptui whatif` on a pipeline's recording (model/pipewhatif.py)."""
    store = got.store
    pipe = store.meta.pipeline
    strategy = next(iter(store.strategies()), None)
    ks = store.complete_steps(strategy) if strategy else []
    steps = [b for b in (store.step_batches(strategy, k) for k in (ks[1:] if len(ks) > 1 else ks)) if b]
    try:
        meas = pipewhatif.measure(steps, pipe)
    except pipewhatif.PipeWhatIfError as e:
        raise CliError(f"{a.file}: a pipeline ({pipe.get('schedule')}, {pipe.get('stages')} stages × "
                       f"{pipe.get('microbatches')} microbatches): `ddptui whatif` {e}") from None
    other = None
    if a.and_file:
        from .summary import read
        og = read(a.and_file)
        opipe = og.store.meta.pipeline
        if opipe is None:
            raise CliError(f"{a.and_file}: not a pipeline's recording (--and takes the same pipeline at another "
                           "microbatch count)")
        ostrat = next(iter(og.store.strategies()), None)
        oks = og.store.complete_steps(ostrat) if ostrat else []
        osteps = [b for b in (og.store.step_batches(ostrat, k) for k in (oks[1:] if len(oks) > 1 else oks)) if b]
        try:
            other = pipewhatif.measure(osteps, opipe)
        except pipewhatif.PipeWhatIfError as e:
            raise CliError(f"{a.and_file}: `ddptui whatif` {e}") from None
        if other.stages != meas.stages or other.microbatches == meas.microbatches:
            raise CliError(f"{a.and_file}: --and takes the same pipeline ({meas.stages} stages) at another "
                           f"microbatch count than {meas.microbatches}; it has {other.stages} stages × "
                           f"{other.microbatches}")
    doc = pipewhatif.predict(meas, a.schedule or pipewhatif.DEFAULT, a.microbatches, other,
                             a.virtual_stages or pipewhatif.VIRTUAL)
    if not doc["predictions"]:
        raise CliError(f"{a.file}: nothing to predict: " + "; ".join(doc["not_predicted"][:4]))
    doc["recording"] = a.file
    if a.json == "-":
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print("\n".join(pipewhatif.text(doc)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


def _f(v, fmt="{:.1f}") -> str:
    return "–" if v is None else fmt.format(v)


def text(rep: whatif_model.Report) -> list[str]:
    b, f = rep.basis, rep.fit
    cap = (f" at bucket_cap_mb {b['cap_mb']:g}{'' if b['cap_explicit'] else ' (DDP default: first bucket 1 MiB)'}"
           if b.get("cap_mb") is not None else "")
    bus = f" (bus {f['bus_gbps']:.2f} GB/s: the fitted per-MB cost)" if f.get("bus_gbps") else ""
    lines = [f"PREDICTIONS from {b['steps']} {b['strategy']} steps ({b['first_step']}–{b['last_step']}){cap}, "
             f"{b['world']} ranks, {b['backend'] or '?'} ({b['lanes']} collective lane{'s' if b['lanes'] > 1 else ''} per rank)",
             f"collective time = alpha + beta x bytes, fitted to {f['collectives']} collectives "
             f"({f['sizes']} size{'s' if f['sizes'] != 1 else ''}): alpha {f['alpha_ms']:.3f} ms, "
             f"beta {f['beta_ms_per_mb']:.3f} ms/MB{bus}; fit error {f['err_pct']:.0f} % (RMS, relative)"
             + (f"; ring step latency {f['hop_ms_used'] * 1e3:g} µs as given" if "hop_ms_used" in f else "")
             + (f"; per-call host cost {f['call_ms'] * 1e3:g} µs as given (out of alpha)" if f.get("call_ms") else "")]
    asked = f.get("bus_gbps_used")
    if asked:
        lines.append(f"predicted at the bus asked for, {asked:g} GB/s (--bus-gbps; nccl-tests' bus bandwidth), "
                     f"not the fitted {_f(f.get('bus_gbps'), '{:.2f}')} GB/s: every collective's bytes at "
                     f"{asked:g} GB/s, alpha as fitted")
    other = ([f"--bus-gbps {asked:g}"] if asked else []) + \
        ([f"--hop-us {f['hop_ms_used'] * 1e3:g}"] if "hop_ms_used" in f else [])
    no_measure = (f"measured: none ({' and '.join(other)}: a what-if of another bus or link has no "
                  "measurement in the recording)") if other else None
    c = f.get("contention")
    if c is not None:
        lines.append("contention, fitted to the recording: "
                     + (f"backward +{c['bwd_per_ms']:.2f} ms per ms a collective overlaps it "
                        f"({c['layers']} layer{'s' if c['layers'] != 1 else ''} seen with and without: "
                        f"{c['with_spans']} / {c['without_spans']} spans)" if c["layers"] else c["note"])
                     + f"; collective +{f.get('coll_per_ms') or 0:.2f} ms per ms of compute under it "
                       "(alpha and beta from those with none: at most 5 % of their time)")
    if rep.caps:
        lines += ["", "DDP bucket cap        predicted                              measured in the recording",
                  f"{'cap MB':>8} {'buckets':>7} {'step ms':>9} {'exposed ms':>10} {'overlap':>8}   "
                  f"{'step ms':>9} {'exposed ms':>10} {'overlap':>8} {'steps':>5}"]
        for p in rep.caps:
            m = p.measured or {}
            lines.append(f"{p.cap_mb:>8g} {p.collectives:>7} {p.step_ms:>9.1f} {p.exposed_ms:>10.1f} "
                         f"{_f(p.overlap_pct, '{:.0f}%'):>8}   {_f(m.get('step_ms')):>9} "
                         f"{_f(m.get('exposed_ms')):>10} {_f(m.get('overlap_pct'), '{:.0f}%'):>8} "
                         f"{m.get('steps', '–'):>5}")
        if no_measure:
            lines.append(no_measure)
        elif not all(p.measured for p in rep.caps):
            lines.append("measured –: the recording ran no ddp steps at that cap")
    if rep.worlds:
        bus = f", bus {rep.worlds[0].bus_gbps:g} GB/s" if rep.worlds[0].bus_gbps else ", fitted beta"
        lines += ["", f"world size (per-rank batch as recorded{bus})        predicted",
                  f"{'strategy':<12} {'ranks':>6} {'step ms':>9} {'comm ms':>9} {'exposed ms':>10} "
                  f"{'overlap':>8} {'efficiency':>10}   {'measured step ms':>16}"]
        for p in rep.worlds:
            m = p.measured or {}
            lines.append(f"{p.strategy:<12} {p.world:>6} {p.step_ms:>9.1f} {p.comm_ms:>9.1f} {p.exposed_ms:>10.1f} "
                         f"{_f(p.overlap_pct, '{:.0f}%'):>8} {_f(p.efficiency_pct, '{:.0f}%'):>10}   "
                         f"{_f(m.get('step_ms')):>16}")
        lines.append("efficiency: the step with instant collectives / the predicted step")
        if no_measure:
            lines.append(no_measure)
        elif not all(p.measured for p in rep.worlds):
            lines.append(f"measured –: the recording ran {rep.basis['world']} ranks, not that many")
    if rep.note:
        lines += ["", "note: " + rep.note]
    return lines


DEFAULT_WORLDS = (2, 4, 8)  # a recording without DDP: the world sizes predicted by default


def main(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    json_target(a.json)
    caps = a.bucket_cap
    from ddptui.model.runinfo import simulated_label

    from .summary import read
    got = read(a.file)
    pipe = got.store.meta.pipeline
    if pipe is not None and not any(s in got.store.strategies() for s in ("ddp", "naive", "interleaved", "fsdp")):
        if caps is not None or a.world:
            raise CliError(f"{a.file}: a pipeline ({pipe.get('schedule')}): --bucket-cap and --world predict data "
                           "parallelism; a pipeline's: --microbatches, --schedule (docs/pipelines.md)")
        return pipeline_main(a, got)
    if a.microbatches or a.schedule or a.and_file or a.virtual_stages:
        raise CliError(f"{a.file}: --microbatches, --schedule, --virtual-stages and --and predict a pipeline's "
                       "recording; this one is none")
    worlds = a.world
    if caps is None and not worlds:
        if "ddp" in got.store.strategies() or a.strategy == "ddp":
            caps = list(spec.BUCKET_LADDER_MB)
        else:  # (no DDP: no bucket cap to move; a hand-written naive or interleaved run)
            worlds = list(DEFAULT_WORLDS)
            if a.json != "-":
                print("no ddp steps in the recording: no bucket cap to predict; world sizes "
                      + ",".join(map(str, worlds)) + " instead (--world)")
    try:
        rep = whatif_model.whatif(got.store, caps=caps, worlds=worlds, bus_gbps=a.bus_gbps,
                       strategy=a.strategy, from_cap=a.from_cap, hop_us=a.hop_us,
                       call_us=a.call_us, contention=not a.no_contention)
    except whatif_model.WhatIfError as e:
        raise CliError(f"{a.file}: {e}") from None
    doc = rep.as_dict()
    doc["recording"] = a.file
    sim = simulated_label(got.store.meta)
    if sim:  # (predictions from a simulated run: a model of a model, and said so)
        doc["simulated"] = sim
    if a.json == "-":
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if sim:
        print(f"{sim}: the recording is a simulated run, not a measurement; these predictions replay the simulation")
    print("\n".join(text(rep)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    return 0
