"""`memascend prepare-ssd`: turn a block device or a preallocated file into a memascend region.

Build, then run: `ssd_probe.gather_target_facts` (I/O, read-only) → `ssd_safety.assess` (pure)
→ `build_actions` (pure: the exact byte ranges to write; `--dry-run` prints them) → confirm →
`apply_actions` (I/O). Heavy imports (rich.progress) happen inside functions.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import sys

import typer

from memascend_cli import __version__

from memascend_cli.ssd import region
from memascend_cli.errors import BadInput
from memascend_cli.ssd.prepare import Action, apply_actions, build_actions, checked_facts
from memascend_cli.units import fmt_bytes, parse_size

_EXAMPLES = """

**Examples:**

```
memascend prepare-ssd --list
memascend prepare-ssd /mnt/nvme/memascend.region --size 200GiB
memascend prepare-ssd /dev/nvme1n1 --ranks 8 --dry-run
memascend prepare-ssd /dev/nvme1n1 --ranks 8 --label node0
memascend prepare-ssd /dev/nvme1n1 /dev/nvme2n1 --label striped
memascend prepare-ssd --info /dev/nvme1n1 --json
memascend prepare-ssd --wipe /mnt/nvme/memascend.region --yes
```
"""


# ---------------------------------------------------------------------------------------------
# Pure builders


def layout_rows(header: region.RegionHeader) -> list[dict]:
    """The region's byte layout: header, reserved area, one row per rank, unused tail."""
    rows = [
        {"part": "header", "start_byte": 0, "end_byte": region.HEADER_BYTES - 1, "bytes": region.HEADER_BYTES},
        {"part": "reserved (zero)", "start_byte": region.HEADER_BYTES, "end_byte": header.data_start_bytes - 1, "bytes": header.data_start_bytes - region.HEADER_BYTES},
    ]
    for r in header.ranks:
        rows.append({"part": f"rank {r.rank}", "start_byte": r.offset_bytes, "end_byte": r.end_bytes - 1, "bytes": r.size_bytes})
    end = header.ranks[-1].end_bytes
    if end < header.capacity_bytes:
        rows.append({"part": "unused tail", "start_byte": end, "end_byte": header.capacity_bytes - 1, "bytes": header.capacity_bytes - end})
    return rows


# ---------------------------------------------------------------------------------------------
# Rendering


def _render_layout(header: region.RegionHeader, title: str) -> None:
    from rich.table import Table

    from memascend_cli.console import out

    table = Table(title=title, title_justify="left")
    table.add_column("part")
    table.add_column("first byte", justify="right")
    table.add_column("last byte", justify="right")
    table.add_column("size", justify="right")
    for row in layout_rows(header):
        table.add_row(row["part"], f"{row['start_byte']:,}", f"{row['end_byte']:,}", fmt_bytes(row["bytes"]))
    out.print(table)


def _render_header(path: str, header: region.RegionHeader) -> None:
    from rich.table import Table

    from memascend_cli.console import out

    table = Table(title=f"memascend region on {path}", title_justify="left", show_header=False)
    table.add_column("field")
    table.add_column("value")
    table.add_row("label", header.label or "-")
    table.add_row("uuid", header.uuid)
    table.add_row("format version", str(header.format_version))
    table.add_row("capacity", f"{fmt_bytes(header.capacity_bytes)} ({header.capacity_bytes:,} B)")
    table.add_row("logical block / alignment", f"{header.logical_block_bytes} B / {header.alignment_bytes} B")
    table.add_row("data start", f"{header.data_start_bytes:,} B")
    table.add_row("ranks", str(len(header.ranks)))
    table.add_row("created", f"{header.created_at} by memascend {header.created_by}")
    p = header.probe
    if p is None:
        table.add_row("bandwidth", "not measured (created with --no-probe)")
    else:
        table.add_row("read / write", f"{p.read_gbps:.2f} / {p.write_gbps:.2f} GB/s")
        table.add_row("best settings", f"block {fmt_bytes(p.best_block_bytes)}, queue depth {p.best_queue_depth}, {p.best_num_workers} workers")
        table.add_row("backend", f"{p.backend} (measured {p.measured_at} over {fmt_bytes(p.probe_bytes)})")
    out.print(table)
    _render_layout(header, "layout" + (" (logical bytes, striped)" if header.members else ""))
    if header.members:
        _render_members(header, member_states(header))
    if p is not None and p.samples:
        _render_samples(p)


def member_states(header: region.RegionHeader) -> list[dict]:
    """Each member of a striped region and what is wrong with it ('ok' when it is there as recorded)."""
    from memascend_cli.ssd.members import member_problem

    n = len(header.members)
    return [{"member": i + 1, "path": m.path, "read_gbps": m.read_gbps, "write_gbps": m.write_gbps,
             "state": member_problem(i, m, header.uuid, n) or "ok"} for i, m in enumerate(header.members)]


def _render_members(header: region.RegionHeader, states: list[dict]) -> None:
    from rich.table import Table

    from memascend_cli.console import out

    table = Table(title=f"members (stripe unit {fmt_bytes(header.stripe_unit_bytes)})", title_justify="left")
    for col, justify in (("member", "right"), ("path", "left"), ("read GB/s", "right"), ("write GB/s", "right"), ("state", "left")):
        table.add_column(col, justify=justify)
    for s in states:
        gbps = [f"{v:.2f}" if v is not None else "-" for v in (s["read_gbps"], s["write_gbps"])]
        table.add_row(str(s["member"]), s["path"], *gbps, s["state"])
    out.print(table)


def _render_samples(p: region.ProbeResult) -> None:
    from rich.table import Table

    from memascend_cli.console import out

    table = Table(title="probe samples", title_justify="left")
    table.add_column("block", justify="right")
    table.add_column("queue depth", justify="right")
    table.add_column("write GB/s", justify="right")
    table.add_column("read GB/s", justify="right")
    for s in p.samples:
        best = s.block_bytes == p.best_block_bytes and s.queue_depth == p.best_queue_depth
        mark = " *" if best else ""
        table.add_row(fmt_bytes(s.block_bytes), str(s.queue_depth), f"{s.write_gbps:.2f}", f"{s.read_gbps:.2f}{mark}")
    out.print(table)


def _render_actions(path: str, actions: list[Action], header: region.RegionHeader) -> None:
    from rich.table import Table

    from memascend_cli.console import out

    table = Table(title=f"dry run: what prepare-ssd would do to {path} (nothing was touched)", title_justify="left")
    table.add_column("step", justify="right")
    table.add_column("action")
    table.add_column("first byte", justify="right")
    table.add_column("last byte", justify="right")
    table.add_column("size", justify="right")
    for i, a in enumerate(actions, 1):
        if a.start_byte is None:
            table.add_row(str(i), a.what, "-", "-", "-")
        else:
            table.add_row(str(i), a.what, f"{a.start_byte:,}", f"{a.end_byte:,}", fmt_bytes(a.nbytes))
    out.print(table)
    _render_layout(header, "resulting layout")


# ---------------------------------------------------------------------------------------------
# I/O steps


def _stdin_is_tty() -> bool:
    # A function so tests can stand in for a terminal.
    return sys.stdin.isatty()


def _confirm(facts, yes: bool, verb: str) -> None:
    """Require --yes, or the device (file) name typed at a prompt; refuse without a TTY."""
    if yes:
        return
    name = facts.device_name or os.path.basename(facts.real_path)
    if not _stdin_is_tty():
        raise BadInput(
            f"{verb} {facts.path} needs confirmation and stdin is not a terminal",
            "add --yes (or run with --dry-run first to see exactly what is written)",
        )
    answer = typer.prompt(f"This will {verb} {facts.path} ({fmt_bytes(facts.size_bytes or facts.requested_size_bytes or 0)}). Type `{name}` to continue")
    if answer.strip() not in (name, facts.path, facts.real_path):
        raise BadInput(f"confirmation did not match `{name}`; nothing was written", "type the name exactly, or pass --yes")


# ---------------------------------------------------------------------------------------------
# The command


def prepare_ssd_command(
    targets: list[str] | None = typer.Argument(None, help="Block device (/dev/nvme1n1, a partition, /dev/loopN) or a file path (with --size). Several: one region striped across them (the first is the region's path). Omit to list candidates.", show_default=False, metavar="TARGET"),
    size: str | None = typer.Option(None, "--size", help="Size of a region file (of each, when several), with a unit: 200GiB, 1TB. Files only.", rich_help_panel="Region", show_default=False),
    ranks: int = typer.Option(1, "--ranks", min=1, max=region.MAX_RANKS, help="Number of per-rank sub-regions (one per local GPU process).", rich_help_panel="Region"),
    label: str = typer.Option("", "--label", help="Free-form label stored in the header (64 characters max).", rich_help_panel="Region"),
    list_devices: bool = typer.Option(False, "--list", help="List candidate block devices and whether each is safe to use.", rich_help_panel="Mode"),
    info: bool = typer.Option(False, "--info", help="Show the region header of TARGET.", rich_help_panel="Mode"),
    wipe: bool = typer.Option(False, "--wipe", help="Remove the region on TARGET (zero its header; delete a region file). Same safety rules.", rich_help_panel="Mode"),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print exactly what would be written and where; touch nothing.", rich_help_panel="Safety"),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation.", rich_help_panel="Safety"),
    force: bool = typer.Option(False, "--force", help="Overwrite a signature, partition table, RAID/LVM member or existing region. Never overrides mounted/in-use/root.", rich_help_panel="Safety"),
    no_probe: bool = typer.Option(False, "--no-probe", help="Skip the bandwidth probe (plan then uses its defaults).", rich_help_panel="Probe"),
    probe_mib: int = typer.Option(256, "--probe-mib", min=1, help="MiB written then read per probe setting (6 settings).", rich_help_panel="Probe"),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable output on stdout.", rich_help_panel="Output"),
) -> None:
    """Prepare an SSD region for offloading: a raw device, a partition, or a preallocated file.

    Writes a checksummed header at offset 0 (sizes, alignment, one sub-region per rank), then
    measures sequential write/read bandwidth over a few block sizes and queue depths and stores
    the best settings for `memascend plan` and `memascend train`. Several targets make one region
    striped across them in 1 MiB units (each probed; the region's GB/s is their sum; a member that
    is missing, swapped or resized is refused by name). A device that is mounted, holds
    the root file system or is in use is always refused; one with a signature, partitions or a
    RAID/LVM role needs --force. Writing a device needs --yes or its name typed at the prompt.
    """
    modes = [m for m, on in (("--list", list_devices), ("--info", info), ("--wipe", wipe)) if on]
    if len(modes) > 1:
        raise BadInput(f"{' and '.join(modes)} cannot be combined", "pick one mode")
    if targets and len(targets) > 1:
        if modes:
            raise BadInput(f"{modes[0]} takes one TARGET, got {len(targets)}", "give a striped region by its first member")
        return _prepare_striped_mode(targets, size=size, num_ranks=ranks, label=label, dry_run=dry_run, yes=yes,
                                     force=force, probe_mib=None if no_probe else probe_mib, json_out=json_out)
    target = targets[0] if targets else None
    if list_devices or (target is None and not modes):
        if target is not None:
            raise BadInput("--list takes no TARGET", "run `memascend prepare-ssd --list`, or drop --list to prepare TARGET")
        return _list_mode(json_out)
    if target is None:
        raise BadInput(f"{modes[0]} needs a TARGET", f"e.g. `memascend prepare-ssd {modes[0]} /dev/nvme1n1`")
    if info:
        return _info_mode(target, json_out)
    if wipe:
        return _wipe_mode(target, dry_run=dry_run, yes=yes, force=force, json_out=json_out)
    return _prepare_mode(
        target, size=size, num_ranks=ranks, label=label, dry_run=dry_run, yes=yes, force=force,
        probe_mib=None if no_probe else probe_mib, json_out=json_out,
    )


prepare_ssd_command.__doc__ = (prepare_ssd_command.__doc__ or "") + _EXAMPLES


def _info_mode(target: str, json_out: bool) -> None:
    from memascend_cli.console import print_json

    if not os.path.exists(target):
        raise BadInput(f"{target} does not exist", "give the region file or device, e.g. `memascend prepare-ssd --info /dev/nvme1n1`")
    try:
        header = region.read_header(target)
    except region.RegionCorrupt as exc:
        raise region.RegionCorrupt(f"{target}: {exc.message}", field=exc.field, byte_start=exc.byte_start, byte_end=exc.byte_end, hint=exc.hint) from None
    except region.NoRegion:
        raise region.NoRegion(f"{target} holds no memascend region", f"create one with `memascend prepare-ssd {target}`") from None
    from memascend_cli.ssd import owner as region_owner

    owners = region_owner.rank_states(target, header)
    if json_out:
        print_json({"target": target, "header": header.to_dict(), "layout": layout_rows(header), "owners": owners,
                    **({"members": member_states(header)} if header.members else {})})
    else:
        _render_header(target, header)
        _render_owners(owners)


def _render_owners(owners: list[dict]) -> None:
    from rich.table import Table

    from memascend_cli.console import out

    table = Table(title="owners", title_justify="left")
    table.add_column("rank", justify="right")
    table.add_column("state")
    table.add_column("owner")
    for o in owners:
        table.add_row(str(o["rank"]), o["state"], o["owner_text"] or "-")
    out.print(table)


def _wipe_mode(target: str, *, dry_run: bool, yes: bool, force: bool, json_out: bool) -> None:
    from memascend_cli.console import err, out, print_json

    if not os.path.exists(target):
        raise BadInput(f"{target} does not exist", "`memascend prepare-ssd --list` shows devices")
    from memascend_cli.ssd.owner import require_unused

    require_unused(target)
    facts, _ = checked_facts(target, "wipe", force)
    header = region.read_header(facts.real_path) if facts.region_state == "intact" else None
    actions = _wipe_actions(facts, header.data_start_bytes if header else region.RESERVED_BYTES)
    # A striped region's other members lose their header copies too (each checked by the same rules).
    for m in header.members[1:] if header is not None and header.member_index == 0 else []:
        if os.path.exists(m.path):
            actions += [dataclasses.replace(a, target=m.path)
                        for a in _wipe_actions(checked_facts(m.path, "wipe", force)[0], header.data_start_bytes)]
    result = {"target": target, "operation": "wipe", "dry_run": dry_run, "actions": [a.to_dict() for a in actions]}
    if dry_run:
        if json_out:
            print_json(result)
        else:
            for a in actions:
                extra = f" (bytes {a.start_byte:,}..{a.end_byte:,})" if a.start_byte is not None else ""
                out.print(f"would {a.what}{extra}; nothing was touched")
        return
    _confirm(facts, yes, "wipe the memascend region on")
    for a in actions:
        if a.op == "unlink":
            os.unlink(a.target or facts.real_path)
        else:
            region.zero_header_area(a.target or facts.real_path, a.nbytes)
    if json_out:
        print_json(result)
    else:
        err.print(f"[green]wiped[/green] the memascend region on {target}")


def _wipe_actions(facts, header_area_bytes: int) -> list[Action]:
    if facts.kind == "file":
        return [Action(op="unlink", what=f"delete the region file {facts.real_path}")]
    return [Action(op="zero", what=f"zero the region header area of {facts.real_path}", start_byte=0,
                   end_byte=header_area_bytes - 1)]


def _prepare_mode(target: str, *, size: str | None, num_ranks: int, label: str, dry_run: bool, yes: bool, force: bool, probe_mib: int | None, json_out: bool) -> None:
    from memascend_cli.console import err, print_json

    size_bytes = _size_and_label(size, label)
    facts = _target_facts(target, size_bytes, force)
    if facts.kind == "file" and size_bytes is None:
        size_bytes = facts.size_bytes  # re-initialise an existing region file at its size
    alignment_bytes = region.region_alignment(facts.logical_block_bytes)
    capacity_bytes = facts.size_bytes if facts.kind == "block" else region.align_down(size_bytes, alignment_bytes)
    header = region.new_header(
        capacity_bytes=capacity_bytes, num_ranks=num_ranks, logical_block_bytes=facts.logical_block_bytes,
        device_alignment_bytes=alignment_bytes, label=label, created_by=__version__,
    )
    probe_plan = None
    if probe_mib is not None:
        from memascend_cli.ssd.probe import plan_probe

        probe_plan = plan_probe(header, probe_mib)
    actions = build_actions(facts, header, probe_plan)
    if dry_run:
        if json_out:
            print_json({
                "target": target, "kind": facts.kind, "dry_run": True, "actions": [a.to_dict() for a in actions],
                "layout": layout_rows(header), "header": header.to_dict(),
            })
        else:
            _render_actions(target, actions, header)
        return
    if facts.kind == "block" or facts.exists:
        _confirm(facts, yes, "overwrite" if facts.kind == "file" else "write a memascend region to")
    header, note = apply_actions(facts, header, actions, probe_plan, progress=not json_out or sys.stderr.isatty())
    if note and header.probe is not None:
        err.print(f"[dim]note: {note}; measured with the Python O_DIRECT fallback[/dim]")
    if json_out:
        print_json({"target": target, "kind": facts.kind, "dry_run": False, "actions": [a.to_dict() for a in actions], "header": header.to_dict(), "layout": layout_rows(header), "backend_note": note})
        return
    _render_header(target, header)
    err.print(f"[green]ready:[/green] {target} is a memascend region ({fmt_bytes(header.capacity_bytes)}, {num_ranks} rank(s)); next: `memascend plan ... --nvme-path {target}`")


def _size_and_label(size: str | None, label: str) -> int | None:
    """--size in bytes (None when not given), after checking --label's length."""
    if len(label) > 64:
        raise BadInput(f"--label is {len(label)} characters, at most 64 fit", "shorten the label")
    return parse_size(size, "--size") if size is not None else None


def _target_facts(target: str, size_bytes: int | None, force: bool):
    """The facts of one target to prepare, after every refusal that does not need them (a mistyped device, --size
    on a device, a new file without --size, a region a running job uses) and prepare-ssd's safety rules."""
    parent = os.path.dirname(os.path.abspath(target))
    if (parent in ("/dev", "/dev/mapper") or parent.startswith("/dev/disk/")) and not os.path.exists(target):
        # A mistyped device name must not turn into "create a region file in /dev".
        raise BadInput(f"{target} does not exist", "`memascend prepare-ssd --list` shows the block devices of this machine")
    is_block = os.path.exists(target) and stat.S_ISBLK(os.stat(target).st_mode)
    if is_block and size_bytes is not None:
        raise BadInput("--size is for region files; a device region always spans the whole device", "drop --size, or use a partition of the size you want")
    if not is_block and not os.path.exists(target) and size_bytes is None:
        raise BadInput(f"creating the region file {target} needs --size", f"e.g. `memascend prepare-ssd {target} --size 200GiB`")
    if os.path.exists(target):
        from memascend_cli.ssd.owner import require_unused

        require_unused(target)  # never re-create a region under a running job, even with --force
    facts, _ = checked_facts(target, "prepare", force, size_bytes)
    return facts


def _prepare_striped_mode(targets: list[str], *, size: str | None, num_ranks: int, label: str, dry_run: bool,
                          yes: bool, force: bool, probe_mib: int | None, json_out: bool) -> None:
    """One region striped across `targets` (ssd/prepare_striped.py): every target checked as one alone would be."""
    from memascend_cli.console import err, print_json
    from memascend_cli.ssd import prepare_striped as P

    size_bytes = _size_and_label(size, label)
    # --size sizes the region files among the targets; devices keep their size.
    is_block = [os.path.exists(t) and stat.S_ISBLK(os.stat(t).st_mode) for t in targets]
    if all(is_block) and size_bytes is not None:
        raise BadInput("--size is for region files; a device member always spans the whole device", "drop --size")
    facts_list = [_target_facts(t, None if blk else size_bytes, force) for t, blk in zip(targets, is_block)]
    header = P.striped_header(facts_list, size_bytes, num_ranks=num_ranks, label=label)
    probe_plan = None
    if probe_mib is not None:
        from memascend_cli.ssd.probe import plan_probe

        probe_plan = plan_probe(header, probe_mib)
    actions = P.build_striped_actions(facts_list, header, probe_plan)
    doc = {"targets": targets, "dry_run": dry_run, "actions": [a.to_dict() for a in actions]}
    if dry_run:
        if json_out:
            print_json({**doc, "layout": layout_rows(header), "header": header.to_dict()})
        else:
            _render_actions(" + ".join(targets), actions, header)
        return
    for f in facts_list:
        if f.kind == "block" or f.exists:
            _confirm(f, yes, "overwrite" if f.kind == "file" else "write a memascend region to")
    header, note = P.apply_striped(facts_list, header, actions, probe_plan, progress=not json_out or sys.stderr.isatty())
    if note and header.probe is not None:
        err.print(f"[dim]note: {note}; measured with the Python O_DIRECT fallback[/dim]")
    if json_out:
        print_json({**doc, "header": header.to_dict(), "layout": layout_rows(header), "backend_note": note})
        return
    _render_header(targets[0], header)
    err.print(f"[green]ready:[/green] {targets[0]} is a memascend region striped across {len(targets)} targets "
              f"({fmt_bytes(header.capacity_bytes)}, {num_ranks} rank(s)); next: `memascend plan ... --nvme-path {targets[0]}`")


def _list_mode(json_out: bool) -> None:
    from memascend_cli.ssd.blockdev import list_block_devices
    from memascend_cli.console import out, print_json
    from memascend_cli.ssd.probe import gather_target_facts
    from memascend_cli.ssd.safety import assess

    rows = []
    devices = list_block_devices()
    for dev in devices:
        if dev.size_bytes <= 0 or dev.type == "rom":
            continue  # detached loops, empty zram: nothing to write to
        facts = gather_target_facts(dev.path, devices=devices)
        verdict = assess(facts, operation="prepare")
        rows.append((dev, facts, verdict))
    if json_out:
        print_json({
            "devices": [
                {**dev.to_dict(), "signatures": [s.describe() for s in f.signatures], "region": f.region_state, "safe": v.ok, "status": v.status, "verdict": v.to_dict()}
                for dev, f, v in rows
            ]
        })
        return
    from rich.table import Table

    table = Table(title="candidate devices for `memascend prepare-ssd`", title_justify="left")
    # Short headers keep the table whole at 80 columns (the caption spells them out).
    table.caption = "rota: rotational · tran: transport · mnt: mount points · sigs: signatures"
    for col, justify in (("device", "left"), ("size", "right"), ("model", "left"), ("rota", "left"), ("tran", "left"),
                         ("mnt", "left"), ("sigs", "left"), ("region", "left"), ("safe", "left")):
        # Device paths and sizes must stay whole; the free-text columns wrap instead.
        table.add_column(col, justify=justify, no_wrap=col in ("device", "size", "safe"))
    for dev, f, v in rows:
        status = {"safe": "[green]yes[/green]", "force": "[yellow]--force[/yellow]", "refused": "[red]no[/red]"}[v.status]
        table.add_row(
            ("  " if dev.parent else "") + dev.path, fmt_bytes(dev.size_bytes), dev.model or "-", "yes" if dev.rotational else "no",
            dev.transport or "-", ", ".join(dev.mountpoints) or "-", ", ".join(s.type for s in f.signatures) or "-",
            {"none": "-", "unreadable": "?"}.get(f.region_state, f.region_state), status,
        )
    out.print(table)
    # Reasons go under the table: as a column they would squeeze every other column to nothing.
    for dev, f, v in rows:
        reasons = v.refusals or v.warnings_needing_force
        if reasons:
            out.print(f"{dev.path}: " + "; ".join(reasons), highlight=False)
    if not rows:
        out.print("no block devices found")
    out.print("a region file works on any ext4/xfs file system: `memascend prepare-ssd /mnt/nvme/memascend.region --size 200GiB`")
