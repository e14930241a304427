"""Making a region striped across several targets (`prepare-ssd A B [C ...]`; the layout is ssd/stripe.py's).

Build, then run, as for one target (ssd/prepare.py): each member's facts are checked by the same rules
(prepare.checked_facts); `build_striped_actions` (pure) lists every member's steps in the order they run: make and
clear every member, record their identities, write each member's copy of the header, probe each member, rewrite the
headers with the measured GB/s; `apply_striped` runs them.
"""

from __future__ import annotations

import dataclasses

from memascend_cli import __version__
from memascend_cli.errors import BadInput, SSDNotReady
from memascend_cli.ssd import region, stripe
from memascend_cli.ssd.members import identify
from memascend_cli.ssd.prepare import Action, build_actions, preallocate, reread_partitions


def member_size_bytes(facts, size_bytes: int | None) -> int:
    """The bytes a member offers: a device's size, a region file's --size (or its size when it exists)."""
    if facts.kind == "block":
        return facts.size_bytes
    return size_bytes if size_bytes is not None else facts.size_bytes


def _identity_before(facts, size: int) -> stripe.MemberIdentity:
    # A file not made yet has no inode: `identify` replaces this once it exists (the `identify` step).
    if facts.exists:
        return identify(facts.real_path)
    return stripe.MemberIdentity(kind="file", dev="", ino=0, size_bytes=size, serial="")


def striped_header(facts_list: list, size_bytes: int | None, *, num_ranks: int, label: str) -> region.RegionHeader:
    """The header of a region striped over the targets of `facts_list` (member 0 first), stripe unit 1 MiB
    (stripe.DEFAULT_STRIPE_UNIT_BYTES: the native engine's request size), at the largest member alignment."""
    if len(facts_list) > stripe.MAX_MEMBERS:
        raise BadInput(f"{len(facts_list)} targets given, a region stripes over at most {stripe.MAX_MEMBERS}",
                       "give fewer targets")
    paths = [f.real_path for f in facts_list]
    dupes = sorted({p for p in paths if paths.count(p) > 1})
    if dupes:
        raise BadInput(f"{', '.join(dupes)} given twice", "give each target once")
    block = max(f.logical_block_bytes for f in facts_list)
    alignment = region.region_alignment(block)
    sizes = [region.align_down(member_size_bytes(f, size_bytes), alignment) for f in facts_list]
    data_start = region.align_up(region.RESERVED_BYTES, alignment)
    unit = stripe.stripe_unit(alignment, stripe.DEFAULT_STRIPE_UNIT_BYTES)
    if stripe.stripes_per_member(sizes, data_start, unit) < 1:
        raise BadInput(f"the smallest target holds no {unit} B stripe past the {data_start} B header area",
                       "use larger targets (--size for files)")
    header = region.new_header(capacity_bytes=stripe.striped_capacity(sizes, data_start, unit), num_ranks=num_ranks,
                               logical_block_bytes=block, device_alignment_bytes=alignment, label=label,
                               created_by=__version__)
    header.members = [stripe.Member(path=f.real_path, identity=_identity_before(f, s)) for f, s in zip(facts_list, sizes)]
    header.stripe_unit_bytes, header.format_version = unit, region.STRIPED_FORMAT_VERSION
    try:
        region.encode(header)
    except ValueError:
        raise BadInput("the member table does not fit the 4 KiB region header", "use shorter target paths, "
                       "fewer members or fewer --ranks") from None
    return header


def member_copy(header: region.RegionHeader, index: int) -> region.RegionHeader:
    """Member `index`'s copy of the header (written at offset 0 of that member)."""
    return dataclasses.replace(header, member_index=index)


def build_striped_actions(facts_list: list, header: region.RegionHeader, probe_plan) -> list[Action]:
    """Every member's steps, in the order apply_striped runs them."""
    actions: list[Action] = []
    for i, f in enumerate(facts_list):
        # build_actions sizes a file or clears a device's tail at the header's capacity: the member's own size here.
        own = dataclasses.replace(header, capacity_bytes=header.members[i].identity.size_bytes)
        actions += [dataclasses.replace(a, target=f.real_path, what=f"member {i + 1}: {a.what}")
                    for a in build_actions(f, own, None) if a.op != "write-header"]
    actions.append(Action(op="identify", what="record every member's device number, inode, size and serial"))
    n = len(facts_list)
    for i, f in enumerate(facts_list):
        actions.append(Action(op="write-header", what=f"member {i + 1}: write its copy of the region header (format "
                              f"v{region.STRIPED_FORMAT_VERSION}, uuid {header.uuid}, member {i + 1} of {n})",
                              start_byte=0, end_byte=region.HEADER_BYTES - 1, target=f.real_path))
    if probe_plan is not None:
        settings = len(probe_plan.block_sizes_bytes) * len(probe_plan.queue_depths)
        for i, f in enumerate(facts_list):
            actions.append(Action(op="probe", what=f"member {i + 1}: bandwidth probe, {settings} settings",
                                  start_byte=probe_plan.offset_bytes, end_byte=probe_plan.end_bytes - 1,
                                  target=f.real_path))
        for i, f in enumerate(facts_list):
            actions.append(Action(op="write-header", what=f"member {i + 1}: rewrite its header with every member's "
                                  "measured GB/s (the region's: their sum)", start_byte=0,
                                  end_byte=region.HEADER_BYTES - 1, target=f.real_path))
    return actions


def summed_probe(results: list[region.ProbeResult], unit_bytes: int) -> region.ProbeResult:
    """The region's probe: every setting's GB/s added over the members (each member's requests go to its own device
    at once), the best setting's sums as the region's bandwidth."""
    by_setting: dict[tuple[int, int], list[float]] = {}
    for r in results:
        for s in r.samples:
            acc = by_setting.setdefault((s.block_bytes, s.queue_depth), [0.0, 0.0])
            acc[0], acc[1] = acc[0] + s.write_gbps, acc[1] + s.read_gbps
    samples = [region.ProbeSample(block_bytes=b, queue_depth=q, write_gbps=round(w, 3), read_gbps=round(r, 3))
               for (b, q), (w, r) in by_setting.items()]
    return region.ProbeResult(read_gbps=round(sum(r.read_gbps for r in results), 3),
                              write_gbps=round(sum(r.write_gbps for r in results), 3), best_block_bytes=unit_bytes,
                              best_queue_depth=min(r.best_queue_depth for r in results),
                              best_num_workers=min(r.best_num_workers for r in results), backend=results[0].backend,
                              measured_at=region.utc_now(), probe_bytes=results[0].probe_bytes, samples=samples)


def apply_striped(facts_list: list, header: region.RegionHeader, actions: list[Action], probe_plan, *,
                  progress: bool = True) -> tuple[region.RegionHeader, str | None]:
    """Run build_striped_actions' steps; OS errors become SSDNotReady naming the member, the step and its bytes."""
    index = {f.real_path: i for i, f in enumerate(facts_list)}
    results: dict[int, region.ProbeResult] = {}
    note = None
    for a in actions:
        try:
            note = _apply_one(a, header, index, results, probe_plan, progress) or note
        except OSError as exc:
            where = f" (bytes {a.start_byte:,}..{a.end_byte:,})" if a.start_byte is not None else ""
            raise SSDNotReady(f"{a.what} failed on {a.target or 'the members'}{where}: {exc.strerror or exc}",
                              "check the member (`dmesg`, free space); the region is not usable until prepared "
                              "again") from None
    return header, note


def _apply_one(a: Action, header, index: dict, results: dict, probe_plan, progress: bool) -> str | None:
    i = index.get(a.target)
    if a.op in ("fallocate", "resize"):
        preallocate(a.target, header.members[i].identity.size_bytes, create=a.op == "fallocate")
    elif a.op == "zero":
        region.write_block(a.target, a.start_byte, bytes(a.nbytes), max(512, header.logical_block_bytes))
    elif a.op == "reread-partitions":
        problem = reread_partitions(a.target)
        if problem:
            from memascend_cli.console import warn

            warn(problem)
    elif a.op == "identify":
        header.members = [dataclasses.replace(m, identity=identify(m.path)) for m in header.members]
    elif a.op == "write-header":
        if results and len(results) == len(header.members):
            header.probe = summed_probe([results[k] for k in range(len(header.members))], header.stripe_unit_bytes)
        copy = member_copy(header, i)
        region.write_header(a.target, copy)
        if region.read_header(a.target) != copy:
            raise SSDNotReady(f"the header read back from member {i + 1}, {a.target}, differs from what was written",
                              "the device may be failing; try another target")
    elif a.op == "probe":
        from memascend_cli.ssd.probe import probe_bandwidth

        results[i], note = probe_bandwidth(a.target, probe_plan, progress=progress)
        m = header.members[i]
        m.read_gbps, m.write_gbps = results[i].read_gbps, results[i].write_gbps
        m.best_block_bytes, m.best_queue_depth = results[i].best_block_bytes, results[i].best_queue_depth
        return note
    elif a.op != "create":  # create: done by fallocate, which creates the file exclusively
        raise AssertionError(f"unknown action {a.op}")
    return None
