"""Rich rendering of the plan's time model (the `time` key of plan --json)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from memascend_cli.console import out


def _s(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def render_time(doc: dict, tokens: int | None) -> None:
    """One row per engine: each resource's busy seconds per step, s/step, tokens/s, what binds and, with --tokens,
    the hours. Fits 80 columns."""
    dev = doc["device"]
    rate = "unknown" if dev["gflops"] is None else (f"{dev['gflops'] / 1e3:,.0f} TFLOP/s" if dev["gpu"] else
                                                    f"{dev['gflops']:,.0f} GFLOP/s")
    bw = [f"{k} {doc[f'ssd_{k}_gbps']:.3g}" for k in ("read", "write") if doc[f"ssd_{k}_gbps"]]
    t = Table(title=f"time per step ({dev['name']} {rate}; SSD {', '.join(bw) + ' GB/s' if bw else 'unknown'})",
              title_justify="left")
    cols = ["", "compute", "SSD", "CPU", "s/step", "tok/s", "binds"] + (["hours"] if tokens else [])
    for c in cols:
        t.add_column(c, justify="left" if c in ("", "binds") else "right", no_wrap=True)
    for e, d in doc["engines"].items():
        r = d["resource_seconds"]
        ssd = None if r["SSD read"] is None or r["SSD write"] is None else r["SSD read"] + r["SSD write"]
        low = d.get("seconds_per_step_at_least")
        step, tok = _s(d["seconds_per_step"]), _s(d["tokens_per_s"])
        if d["seconds_per_step"] is None and low:
            step, tok = "≥" + _s(low), "≤" + _s(d["tokens_per_step"] / low)
        cpu = r["CPU Adam"] + (r.get("host copies") or 0.0)  # the host's own work: Adam, stock's copies
        row = [e, _s(r["compute"]), _s(ssd), _s(cpu), step, tok, d["binding"]]
        if tokens:
            row.append(_s(d["hours"]))
        t.add_row(*row)
    out.print(t)
    if doc.get("precision_note"):
        out.print(f"[yellow]note: {doc['precision_note']}[/yellow]", highlight=False)
    if dev.get("host_terms_fitted") is False and dev["gflops"] is not None:  # absent before the per-CPU terms
        out.print(f"[dim]note: the CPU's copies, norms and checksums are priced with the terms fitted on "
                  f"{escape(dev['host_terms'])} (none were fitted on this CPU)[/dim]", highlight=False)
    if dev["gflops"] is None:
        out.print(f"[dim]note: compute rate {dev['source']}[/dim]", highlight=False)
    elif len(bw) < 2:
        out.print("[dim]note: SSD bandwidth unknown: s/step is at least the time without the SSD, which may well "
                  "bind; give --nvme-read-gbps / --nvme-write-gbps or --nvme-path a region made by `memascend "
                  "prepare-ssd`[/dim]")
    if doc.get("fastest"):
        f = Table(title="most tokens/s that fits in memory (context held)", title_justify="left")
        for c in ("", "micro-batch", "grad-accum", "s/step", "tok/s", "binds"):
            f.add_column(c, justify="left" if c in ("", "binds") else "right", no_wrap=True)
        for e, b in doc["fastest"].items():
            f.add_row(e, *(("does not fit", "", "", "", "") if b is None else
                           (str(b["micro_batch"]), str(b["grad_accum"]), _s(b["seconds_per_step"]),
                            _s(b["tokens_per_s"]), b["binding"])))
        out.print(f)
    if tokens and dev["gflops"] is not None:
        out.print(f"[dim]hours: for {tokens:,} tokens; compute rate from {dev['source']}[/dim]", highlight=False)
