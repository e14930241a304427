"""`memascend inspect`: what this machine offers for SSD-offloaded training."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import typer

from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.units import GiB

if TYPE_CHECKING:
    # hardware.py pulls in ctypes, mmap and subprocess; `memascend --help` does not need them.
    from memascend_cli.hardware import Inventory

CPU_ONLY_NOTE = "none (CPU-only: DeepSpeed will run on the CPU accelerator with gloo)"


def _yes_no(value: bool | None) -> str:
    if value is None:
        return "unknown"
    return "yes" if value else "no"


def _memlock_text(nbytes: int | None) -> str:
    from memascend_cli.units import fmt_bytes

    return "unlimited" if nbytes is None else fmt_bytes(nbytes)


def _memory_table(inv: Inventory):
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="Memory & limits", title_justify="left", show_header=False)
    table.add_column("item", style="bold")
    table.add_column("value")
    table.add_row("DRAM total", f"{inv.dram_total_gib:,.2f} GiB")
    table.add_row("DRAM available", f"{inv.dram_available_gib:,.2f} GiB")
    table.add_row("swap", f"{inv.swap_total_gib:,.2f} GiB")
    lock_note = " (not binding: CAP_IPC_LOCK)" if inv.cap_ipc_lock and inv.memlock_soft_bytes is not None else ""
    table.add_row(
        "RLIMIT_MEMLOCK soft / hard",
        f"{_memlock_text(inv.memlock_soft_bytes)} / {_memlock_text(inv.memlock_hard_bytes)}{lock_note}",
    )
    table.add_row("root / CAP_IPC_LOCK", f"{_yes_no(inv.is_root)} / {_yes_no(inv.cap_ipc_lock)}")
    table.add_row("huge pages reserved", f"{inv.hugepages_total} x {inv.hugepage_size_kib} KiB")
    table.add_row("transparent huge pages", inv.thp_mode or "unknown")
    table.add_row("CPUs", escape(f"{inv.cpu_cores} logical" + (f" ({inv.cpu_model})" if inv.cpu_model else "")))
    table.add_row("kernel", escape(inv.kernel))
    return table


def _gpu_table(inv: Inventory):
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    if not inv.gpus:
        return Text(f"GPUs: {CPU_ONLY_NOTE}")
    table = Table(title="GPUs", title_justify="left")
    table.add_column("index", justify="right")
    table.add_column("name")
    table.add_column("memory GiB", justify="right")
    for gpu in inv.gpus:
        table.add_row(str(gpu["index"]), escape(gpu["name"]), f"{gpu['memory_gib']:,.2f}")
    return table


def _media(dev) -> str:
    """Transport and medium in one short cell: 'nvme', 'sata rot', 'usb nonrot', 'rot' (virtio, loop)."""
    if dev.is_nvme:
        return "nvme"
    # "nonrot", not "ssd": zram and many virtual disks are non-rotational without being SSDs.
    medium = "rot" if dev.rotational else "nonrot"
    return f"{dev.transport} {medium}" if dev.transport else medium


def _block_table(inv: Inventory):
    from rich import box
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    # Meant to stay readable at 80 columns: light borders, transport/NVMe/rotational folded into
    # one `media` cell, the model on a second line under each disk (partitions inherit it).
    table = Table(
        title="Block devices", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
        caption=(
            "media: transport and rot/nonrot (rotational flag; virtual disks often say rot); "
            "block = logical/physical"
        ),
        caption_justify="left",
    )
    table.add_column("device", overflow="ellipsis", max_width=26)
    table.add_column("type", no_wrap=True)
    table.add_column("GiB", justify="right", no_wrap=True)
    table.add_column("media", no_wrap=True)
    table.add_column("block B", justify="right", no_wrap=True)
    table.add_column("fs", overflow="fold")
    table.add_column("mounted on", overflow="fold")
    for dev in inv.block_devices:
        # Indent stacked devices under their parent, as lsblk does.
        device = Text("  " + dev.name if dev.parent else dev.name, no_wrap=True, overflow="ellipsis")
        if dev.parent is None and dev.model:
            device.append("\n  " + dev.model, style="dim")
        table.add_row(
            device,
            dev.type,
            f"{dev.size_bytes / GiB:.1f}",
            _media(dev),
            f"{dev.logical_block_bytes}/{dev.physical_block_bytes}",
            escape(dev.fstype or "-"),
            escape(", ".join(dev.mountpoints) or "-"),
        )
    return table


def _path_table(inv: Inventory):
    from rich.markup import escape
    from rich.table import Table

    # Paths and OS messages are data, not Rich markup: escape them.
    info = inv.path
    table = Table(title=f"Swap path {escape(info.path)}", title_justify="left", show_header=False)
    table.add_column("item", style="bold")
    table.add_column("value")
    table.add_row("kind", "block device" if info.is_block_device else "file system path")
    table.add_row("device", escape(info.device or "- (no block device: tmpfs, overlay or network FS)"))
    table.add_row("filesystem", escape(info.fstype or "-"))
    table.add_row("free / total", f"{_opt_bytes(info.free_bytes)} / {_opt_bytes(info.total_bytes)}")
    style = {True: "green", False: "red", None: "yellow"}[info.o_direct_ok]
    table.add_row("O_DIRECT", f"[{style}]{_yes_no(info.o_direct_ok)}[/{style}]: {escape(info.o_direct_reason)}")
    align = (
        f"memory {info.dio_mem_align} B, offset {info.dio_offset_align} B"
        if info.dio_mem_align is not None or info.dio_offset_align is not None
        else "not reported (statx STATX_DIOALIGN)"
    )
    table.add_row("DIO alignment", align)
    return table


def _opt_bytes(nbytes: int | None) -> str:
    from memascend_cli.units import fmt_bytes

    return "-" if nbytes is None else fmt_bytes(nbytes)


def _io_table(inv: Inventory):
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="I/O backends", title_justify="left")
    table.add_column("backend")
    table.add_column("available")
    table.add_column("dev header")
    table.add_column("why")
    for backend, status in inv.io_backends.items():
        style = "green" if status["available"] else "red"
        table.add_row(
            backend,
            f"[{style}]{_yes_no(status['available'])}[/{style}]",
            _yes_no(status.get("dev_header")),
            escape(status["reason"]),
        )
    return table


def render_inventory(inv: Inventory) -> list:
    """Rich renderables for the full `inspect` view, in display order."""
    parts = [_memory_table(inv), _gpu_table(inv), _block_table(inv)]
    if inv.path is not None:
        parts.append(_path_table(inv))
    parts.append(_io_table(inv))
    return parts


def _summary_lines_inventory(inv: Inventory) -> list[str]:
    lines = [
        f"DRAM {inv.dram_total_gib:,.1f} GiB ({inv.dram_available_gib:,.1f} available), "
        f"swap {inv.swap_total_gib:,.1f} GiB, {inv.cpu_cores} CPUs",
        "memlock " + ("unlimited (CAP_IPC_LOCK)" if inv.cap_ipc_lock else _memlock_text(inv.memlock_soft_bytes)),
    ]
    if inv.gpus:
        names = sorted({g["name"] for g in inv.gpus})
        smallest_gib = min(g["memory_gib"] for g in inv.gpus)
        lines.append(f"GPUs {len(inv.gpus)}x {', '.join(names)}, {smallest_gib:,.1f} GiB each")
    else:
        lines.append(f"GPUs {CPU_ONLY_NOTE}")
    if inv.path is not None:
        info = inv.path
        lines.append(
            f"swap path {info.path}: {info.fstype or '-'}, {_opt_bytes(info.free_bytes)} free, "
            f"O_DIRECT {_yes_no(info.o_direct_ok)}"
        )
    backends = ", ".join(f"{name} {_yes_no(s['available'])}" for name, s in inv.io_backends.items())
    lines.append(f"I/O: {backends}")
    return lines


def _summary_lines_spec(spec: HardwareSpec) -> list[str]:
    if spec.can_lock_unlimited or spec.memlock_limit_gib is None:
        memlock = "unlimited"
    else:
        memlock = f"{spec.memlock_limit_gib * 1024:,.0f} MiB"
    lines = [f"DRAM {spec.dram_gib:,.1f} GiB ({spec.usable_dram_gib:,.1f} usable) per node, {spec.num_nodes} node(s), "
             f"{spec.cpu_cores} CPUs, memlock {memlock}"]
    if spec.num_gpus:
        lines.append(f"GPUs {spec.num_gpus}x {spec.gpu_name or 'GPU'}, {spec.gpu_mem_gib:,.1f} GiB each")
    else:
        lines.append(f"GPUs {CPU_ONLY_NOTE}")
    free = "unknown" if spec.nvme_free_gib is None else f"{spec.nvme_free_gib:,.0f} GiB free"
    read = "unknown" if spec.nvme_read_gbps is None else f"{spec.nvme_read_gbps:g} GB/s"
    write = "unknown" if spec.nvme_write_gbps is None else f"{spec.nvme_write_gbps:g} GB/s"
    lines.append(f"NVMe {spec.nvme_path or '(path not given)'}: {free}, read {read}, write {write}")
    return lines


def render_inventory_summary(inv_or_spec: Inventory | HardwareSpec):
    """One compact panel for the top of `plan`: the machine as probed (Inventory) or as planned (HardwareSpec)."""
    from rich.panel import Panel
    from rich.text import Text

    if isinstance(inv_or_spec, HardwareSpec):
        title = f"Hardware: {inv_or_spec.name} ({inv_or_spec.source})"
        lines = _summary_lines_spec(inv_or_spec)
    else:
        title, lines = "Hardware (probed)", _summary_lines_inventory(inv_or_spec)
    return Panel(Text("\n".join(lines)), title=title, title_align="left", expand=False)


def inspect_command(
    nvme_path: Optional[str] = typer.Option(
        None, "--nvme-path", help="Swap location to check: a directory, region file or block device.",
        rich_help_panel="Hardware",
    ),
    cpu_probe: bool = typer.Option(False, "--cpu-probe", help="Measure this CPU's matmul GFLOP/s (fp32, bf16) "
                                   "and memory bandwidth (a few seconds, needs torch) and cache them for "
                                   "`memascend plan`'s time model (off by default: inspect stays under a second).",
                                   rich_help_panel="Hardware"),
    json_out: bool = typer.Option(False, "--json", help="Print the inventory as JSON.", rich_help_panel="Output"),
) -> None:
    """Show what this machine offers for SSD-offloaded training.

    DRAM, swap, RLIMIT_MEMLOCK and huge pages; GPUs; block devices (NVMe or not, block sizes,
    mount points); I/O backends (io_uring, libaio). With `--nvme-path`, also the filesystem, free
    space and whether O_DIRECT really works there (tmpfs accepts it without enforcing it).

    Examples:

        memascend inspect

        memascend inspect --nvme-path /mnt/nvme/memascend

        memascend inspect --json
    """
    from memascend_cli.console import out, print_json
    from memascend_cli.hardware import probe, require_existing_path

    if nvme_path is not None:
        require_existing_path(nvme_path)
    inv = probe(nvme_path)
    from memascend_cli.compute_probe import cached_cpu, probe_cpu

    matmul = probe_cpu(inv.cpu_model, inv.cpu_cores) if cpu_probe else cached_cpu(inv.cpu_model, inv.cpu_cores)
    if json_out:
        print_json({**inv.to_dict(), "cpu_matmul": matmul})
        return
    for part in render_inventory(inv):
        out.print(part)
    for line in matmul_lines(matmul, measured_now=cpu_probe):
        out.print(line, highlight=False)
    if inv.path is not None and inv.path.o_direct_ok is False:
        from rich.markup import escape

        from memascend_cli.console import warn

        warn(escape(f"{inv.path.path} is not usable for direct I/O: {inv.path.o_direct_reason}"))


def matmul_lines(matmul: dict | None, *, measured_now: bool) -> list[str]:
    """The CPU probe's lines: the rate per dtype, the memory bandwidth, and a note for each reduced precision that is
    slow here. Pure."""
    from memascend_cli.compute_probe import slow_precision_note, unknown_rate_hint

    if not matmul or not matmul.get("fp32_gflops"):
        return ["CPU matmul: " + (unknown_rate_hint().removeprefix("unknown: ") if measured_now else
                                  "not measured: `memascend inspect --cpu-probe` (plan measures it once too)")]
    rates = ", ".join(f"{matmul[f'{d}_gflops']:,.1f} GFLOP/s {d}" if matmul.get(f"{d}_gflops") else
                      f"{d} did not finish in its budget" for d in ("fp32", "bf16", "fp16")
                      if matmul.get(f"{d}_gflops") or d in (matmul.get("incomplete") or []))
    lines = [f"CPU matmul ({'measured now' if measured_now else 'cached'}; `memascend plan` uses it): {rates} on "
             f"{matmul['threads']} threads"]
    if matmul.get("mem_triad_gbps"):  # absent from a cache older than the memory probe
        lines.append(f"CPU memory bandwidth: {matmul['mem_triad_gbps']:g} GB/s (STREAM triad, {matmul['threads']} "
                     "threads)")
    lines += [f"note: {n}" for n in (slow_precision_note(d, matmul) for d in ("bf16", "fp16")) if n]
    return lines

