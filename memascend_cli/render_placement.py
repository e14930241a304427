"""Rich rendering of the plan's placements (the `placements` key of plan --json): one row per placement and engine,
the recommended one marked, and why. Fits 80 columns."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from memascend_cli.console import out
from memascend_cli.units import GiB


def _n(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _step(time: dict | None) -> tuple[str, str]:
    """(s/step, tok/s) cells: a lower bound where an SSD rate is unknown, '?' without a compute rate."""
    if time is None:
        return "?", "?"
    if time["seconds_per_step"] is not None:
        return _n(time["seconds_per_step"]), _n(time["tokens_per_s"])
    low = time.get("seconds_per_step_at_least")
    return ("≥" + _n(low), "≤" + _n(time["tokens_per_step"] / low)) if low else ("?", "?")


def render_placements(doc: dict, gpu: bool) -> None:
    """The placements table (GiB per node, SSD GB moved per step), then the recommendation and what it assumes."""
    rec, planned = doc["recommended"], False
    t = Table(title="placements (per node: peak GiB; SSD GB read + written per step)", title_justify="left")
    cols = ["", "engine", "host", *(["GPU"] if gpu else []), "SSD", "s/step", "tok/s", "binds"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("", "engine", "binds") else "right", no_wrap=True)
    for r in doc["rows"]:
        if not r["applicable"]:
            continue
        mark = "→" if rec and (r["placement"], r["engine"]) == (rec["placement"], rec["engine"]) else " "
        planned |= not r["runnable"]
        step, tok = _step(r["time"]) if r["fits"] else ("—", "—")
        ssd = (r["ssd_read_bytes_per_step"] + r["ssd_write_bytes_per_step"]) / 1e9
        t.add_row(mark + r["placement"], r["engine"] + ("" if r["runnable"] else "*"),
                  f"{r['host_peak_bytes'] / GiB:,.1f}",
                  *([f"{r['gpu_peak_bytes'] / GiB:,.1f}"] if gpu else []), _n(ssd), step, tok,
                  r["binding"].replace("GPU memory", "GPU mem"))  # 80 columns
    out.print(t)
    # Why a row is missing, or what a priced one runs with (stock's split without prefetch).
    notes = [f"{r['placement']}/{r['engine']}: {r['note']}" for r in doc["rows"] if r["note"] and r["placement"] != "gpu"]
    out.print(f"[dim]headroom kept: {doc['headroom_bytes'] / GiB:,.1f} GiB of DRAM beside each placement's peak "
              f"(all-SSD rows: none); memascend's DRAM tier budget {doc['dram_budget_bytes'] / GiB:,.1f} GiB"
              + "".join(f"; {escape(n)}" for n in notes) + "[/dim]", highlight=False)
    if planned:
        out.print("[dim]* planned: memascend's DRAM tier is not in the engine yet[/dim]", highlight=False)
    style = "green" if rec else "red"
    out.print(f"[bold {style}]→ recommended:[/bold {style}] {escape(doc['why'])}", highlight=False)
