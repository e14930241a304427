"""Rich rendering of plan results (stdout). The --json twin is commands/plan.build_result."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from memascend_cli.console import out
from memascend_cli.planner.zero import ENGINES
from memascend_cli.planner.search import GRID_END, RESOURCE_NAMES
from memascend_cli.units import GiB


def _gib(n: int | None) -> str:
    return "—" if n is None else f"{n / GiB:,.2f}"


def _items_table(title: str, tier: str, ests, details: bool) -> Table | None:
    b, m = ests["stock"], ests["memascend"]
    keys: list[str] = []
    for est in (b, m):
        for i in est.items:
            if i.tier == tier and i.key not in keys:
                keys.append(i.key)
    if not keys:
        return None
    t = Table(title=title, title_justify="left", show_footer=False)
    t.add_column("item")
    t.add_column("stock GiB", justify="right", no_wrap=True)
    t.add_column("memascend GiB", justify="right", no_wrap=True)
    t.add_column("kind / pinning")
    for key in keys:
        bi, mi = b.item(key), m.item(key)
        ref = bi or mi
        how = ref.kind if ref.kind != "steady" else ""
        pins = {p for p in ((bi.pinned if bi else ""), (mi.pinned if mi else "")) if p}
        if pins:
            how = (how + " " if how else "") + " / ".join(sorted(pins))
        t.add_row(ref.label, _gib(bi.bytes if bi else None), _gib(mi.bytes if mi else None), how)
    return t


def _formulas(tier: str, ests) -> None:
    """--details: each item's formula and source under its table, as wrapped lines (an 80-column
    terminal has no room for them as a table column)."""
    b, m = ests["stock"], ests["memascend"]
    seen: set[tuple[str, str]] = set()
    for est, who in ((b, "stock"), (m, "memascend")):
        for i in est.items:
            if i.tier != tier or not (i.formula or i.source):
                continue
            other = (m if est is b else b).item(i.key)
            same = other is not None and other.formula == i.formula and other.source == i.source
            if (i.key, i.formula) in seen:
                continue
            seen.add((i.key, i.formula))
            label = i.label if same else f"{i.label} ({who})"
            out.print(Text.assemble((f"  {label}: ", "bold"), i.formula, (f" [{i.source}]" if i.source else "", "dim")))


def render_plan(result: dict, ests, details: bool = False) -> None:
    """Print the plan: machine line, per-tier breakdowns, totals, search, verdict."""
    mdl, job, hw = result["model"], result["job"], result["hardware"]
    b, m = ests["stock"], ests["memascend"]
    gpu = f"{hw['num_gpus']} x {hw['gpu_name'] or 'GPU'} {hw['gpu_mem_gib']:.0f} GiB" if hw["num_gpus"] else \
        "no GPU (CPU-only: DeepSpeed on the CPU accelerator)"
    memlock = "unlimited" if hw["can_lock_unlimited"] or hw["memlock_limit_gib"] is None else f"{hw['memlock_limit_gib']:.3f} GiB"
    nvme = "unknown (not checked)" if hw["nvme_free_gib"] is None else f"{hw['nvme_free_gib']:,.0f} GiB free"
    if hw["nvme_free_gib"] is not None and hw.get("nvme_path"):
        nvme += f" at {hw['nvme_path']}"
    if hw.get("nvme_read_gbps"):
        nvme += f", {hw['nvme_read_gbps']:.1f} GB/s read"
    out.print(f"[bold]machine[/bold] {hw['name']} ({hw['source']}): {hw['dram_gib']:.1f} GiB DRAM "
              f"({hw['usable_dram_gib']:.1f} usable) · {gpu} · {hw['num_nodes']} node(s) · memlock {memlock} · SSD {nvme}")
    out.print(f"[bold]job[/bold] {mdl['name']}{' (default)' if mdl.get('default_used') else ''}: "
              f"{mdl['num_params']:,} params · seq {job['seq_len']:,} x micro-batch {job['micro_batch']} · {job['dtype']} · "
              f"{job['ranks_per_node']} rank(s)/node, world {job['world_size']} · checkpointing {job['checkpointing']} · "
              f"stock DeepSpeed {job['deepspeed_version']}")
    if "model_init" in job:
        from memascend_cli.planner.job import MODEL_INIT_WORDS

        loss = ("memascend train's chunked loss (--chunked-loss; a script's own: --full-logits)" if job["chunked_loss"]
                else "the model's own over the full logits (--full-logits)")
        out.print(f"[bold]model[/bold] assumed {MODEL_INIT_WORDS[job['model_init']]} (--model-init "
                  f"{job['model_init']}); loss {loss}", highlight=False)
    for note in sorted(set(b.notes + m.notes)):
        out.print(f"[dim]note: {note}[/dim]")
    host = _items_table("host memory per rank", "host", ests, details)
    out.print(host)
    if details:
        _formulas("host", ests)
    t = ests.get("tuned")
    totals = Table(title="totals (tuned = stock DeepSpeed given memascend's knobs)", title_justify="left")
    totals.add_column("")
    for col in (*ENGINES, "vs stock", "vs tuned"):
        totals.add_column(col, justify="right")

    def pct(ref, x):
        return "" if not ref else f"{100 * (ref - x) / ref:.1f}%"

    def row(label, bb, tb, mb):
        totals.add_row(label, f"{bb / GiB:,.2f}", "" if tb is None else f"{tb / GiB:,.2f}", f"{mb / GiB:,.2f}",
                       pct(bb, mb), "" if tb is None else pct(tb, mb))

    def g(est, attr):
        return None if est is None else getattr(est, attr)

    row("host steady/rank GiB", b.host_steady_bytes, g(t, "host_steady_bytes"), m.host_steady_bytes)
    row("host peak/rank GiB", b.host_peak_bytes, g(t, "host_peak_bytes"), m.host_peak_bytes)
    row("host peak/node GiB", b.node_host_peak_bytes, g(t, "node_host_peak_bytes"), m.node_host_peak_bytes)
    row("mlocked/rank GiB", b.locked_bytes, g(t, "locked_bytes"), m.locked_bytes)
    if b.pinned_waste_bytes or m.pinned_waste_bytes:
        row("pow2 waste/rank GiB", b.pinned_waste_bytes, g(t, "pinned_waste_bytes"), m.pinned_waste_bytes)
    if hw["num_gpus"]:
        row("GPU peak/GPU GiB", b.gpu_peak_bytes, g(t, "gpu_peak_bytes"), m.gpu_peak_bytes)
    row("SSD space/node GiB", b.node_nvme_bytes, g(t, "node_nvme_bytes"), m.node_nvme_bytes)

    def traffic(est, which):
        return None if est is None or est.traffic is None else getattr(est.traffic, which)

    row("SSD read/step GiB", traffic(b, "read_total"), traffic(t, "read_total"), traffic(m, "read_total"))
    row("SSD write/step GiB", traffic(b, "write_total"), traffic(t, "write_total"), traffic(m, "write_total"))
    out.print(totals)
    if details:
        for title, tier in (("GPU memory per GPU", "gpu"), ("SSD space per rank", "nvme")):
            t = _items_table(title, tier, ests, details)
            if t is not None:
                out.print(t)
                _formulas(tier, ests)
    engines = result["engines"]
    if "search" in engines["stock"]:
        s = Table(title=f"what fits on this machine (seq {job['seq_len']:,}, micro-batch {job['micro_batch']} held fixed; "
                        "\\[what binds])", title_justify="left")
        s.add_column("")
        s.add_column("stock DeepSpeed", justify="right")
        s.add_column("memascend", justify="right")

        def fmt(e, key, params_key=None):
            v, binding = engines[e]["search"][key], engines[e]["search"]["binding"][key]
            bound = f" [{RESOURCE_NAMES[binding]}]"
            if v is None:
                return escape("does not fit" + bound)
            text = f"{v} ({engines[e]['search'][params_key] / 1e9:.2f}B)" if params_key else f"{v:,}"
            # The grid's end fits: the real maximum is at least that.
            return escape(("at least " if binding == GRID_END and key != "largest_preset" else "") + text + bound)

        s.add_row("largest micro-batch", fmt("stock", "max_micro_batch"), fmt("memascend", "max_micro_batch"))
        s.add_row("longest context (tokens)", fmt("stock", "max_seq_len"), fmt("memascend", "max_seq_len"))
        s.add_row("largest preset in family", fmt("stock", "largest_preset", "largest_preset_params"),
                  fmt("memascend", "largest_preset", "largest_preset_params"))
        s.add_row("deepest scaled model (layers)", fmt("stock", "max_layers", "max_layers_params"),
                  fmt("memascend", "max_layers", "max_layers_params"))
        out.print(s)
    if m.traffic is not None:
        r, w = m.traffic.per_param()
        rr, rw = m.traffic.roofline_per_param
        out.print(f"SSD traffic with memascend: {r:.1f} B read + {w:.1f} B written per parameter per step (roofline "
                  f"{rr:.1f} + {rw:.1f}: the parameters' fetches, the optimizer states once, no gradient); "
                  f"{1000 * m.traffic.write_total * m.ranks_per_node / 1e12:,.1f} TB written per 1,000 steps per "
                  "node (check the drive's rated TBW)", highlight=False)
    v = result["verdict"]
    red = result["reduction_percent"]
    line = f"host peak memory: {red['host_peak']:.1f}% less with memascend than stock"
    if "host_peak_vs_tuned" in red:
        line += f", {red['host_peak_vs_tuned']:.1f}% less than tuned stock"
    out.print(Text(line, style="bold"))
    out.print(Text(("✓ " if v["fits"] else "✗ ") + v["line"], style="green" if v["fits"] else "red"))
    if "dram_cap" in result:
        out.print(result["dram_cap"]["line"], highlight=False)
