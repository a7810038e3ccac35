"""Text output of figures: the per-strategy table, speedups and the JSON document."""
from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.table import Table

from . import figures as F


def _f(v, fmt="{:.2f}", na="—"):
    return na if v is None else fmt.format(v)


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
                  _f(r["overlap_pct"], "{:.0f}"), _f(r["allreduce_calls_per_step"], "{:.0f}"),
                  _f(r["bytes_per_step"] / 1e6 if r.get("bytes_per_step") is not None else None, "{:.1f}"),
                  _f(r["samples_per_s"], "{:,.0f}"), _f(r.get("bus_bw_gbps"), "{:.2f}"))
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
    transfer 19.9 ms · culprit rank 1 · fc2 backward +40 ms'."""
    st = r.get("stragglers")
    if not st:
        return None
    waits = ", ".join(f"r{k} {v:.1f} ms" for k, v in st["wait_ms_median"].items())
    who = (f"rank {st['last_arriver_rank']} arrived last in {st['last_arriver_pct']:.0f} % of steps"
           if st["last_arriver_rank"] is not None else "nobody arrived last")
    line = f"{r['strategy']}: {who} · wait {waits} (median) · transfer {st['transfer_ms_median']:.1f} ms"
    return line + (f" · culprit {st['culprit']}" if st.get("culprit") else " · no culprit")


def print_summary(rows: list[dict], meta: dict, file=None, title: str = "") -> None:
    out = file or sys.stdout
    console = Console(file=file, width=None if out.isatty() else 160)
    console.print(summary_table(rows, title))
    for line in speedup_lines(F.speedups(rows)):
        console.print(line)
    waits = [x for x in (straggler_line(r) for r in rows) if x]
    if waits:
        console.print("who waits for whom (per collective: last arriver's ready - own ready; transfer: end - last ready):")
        for line in waits:
            console.print("  " + line, markup=False, highlight=False)


def json_doc(rows: list[dict], meta: dict, extra: dict | None = None) -> dict:
    doc = {
        "model": meta.get("model"), "world_size": meta.get("world"), "batch": meta.get("batch"),
        "backend": meta.get("backend"), "device": meta.get("device"), "torch": meta.get("torch"),
        "strategies": rows, "speedup": F.speedups(rows),
    }
    if extra:
        doc.update(extra)
    return doc


def write_json(path: str, doc: dict) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
