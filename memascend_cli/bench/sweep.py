"""What `memascend bench` builds once its options are checked: the machine the runs are planned on, the time model's
inputs, the sitting's record, and the sweep over layers x sequence length (one folder and bench.json per point, then
sweep.json)."""

from __future__ import annotations

import dataclasses
import os


def folders(out_dir: str, nvme_dir: str | None, region: str | None,
            ssd_bytes_per_s: int | None) -> tuple[str, str, dict, tuple]:
    """(OUT, created; the stock runs' swap directory, default OUT/swap; its checks (runner.check_nvme_dir, which
    refuses tmpfs); the io limits of --ssd-bandwidth on the devices under it and memascend's region)."""
    from memascend_cli.bench import runner

    out_dir = os.path.abspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    nvme_dir = os.path.abspath(nvme_dir or os.path.join(out_dir, "swap"))
    nvme_info = runner.check_nvme_dir(nvme_dir)
    io_limits = ()
    if ssd_bytes_per_s is not None:
        from memascend_cli.run.iolimit import resolve_limits

        # The stock runs' swap files and memascend's region (a fresh one goes into OUT), each member of a striped
        # region throttled on its own: N members at the limit each, as N drives would be.
        paths = [nvme_dir, os.path.abspath(region) if region else out_dir] + region_members(region)
        io_limits = tuple(resolve_limits(paths, ssd_bytes_per_s))
    return out_dir, nvme_dir, nvme_info, io_limits


def region_members(region: str | None) -> list[str]:
    """The paths of a striped region's members (the region's own path excluded); none for one target."""
    if region is None or not os.path.exists(region):
        return []
    from memascend_cli.ssd.path import region_header

    header = region_header(region)
    return [m.path for m in header.members[1:]] if header is not None else []


def remove_regions(out_dir: str, *, keep: str | None) -> int:
    """Delete the regions the bench made under OUT (each point's or capacity probe's bench.region: the size of the
    job's states, GiBs each), keeping `keep` (a --region the user gave); says so. Returns the bytes freed. The records
    (bench.json, timelines, plots) stay; a stock run's swap files are its own run's to remove (runner.run_one)."""
    from memascend_cli.console import err
    from memascend_cli.units import GiB

    keep_path = os.path.realpath(keep) if keep else None
    freed = 0
    for folder, _, files in os.walk(out_dir):
        path = os.path.join(folder, "bench.region")
        if "bench.region" in files and os.path.realpath(path) != keep_path:
            freed += os.stat(path).st_blocks * 512  # what the disk gets back: a region file may be sparse
            os.unlink(path)
    if freed:
        err.print(f"removed the bench's region files under {out_dir} ({freed / GiB:.1f} GiB): pass --region to "
                  "keep one between benches")
    return freed


def bench_hardware(*, dram_cap_bytes: int | None, region: str | None, accelerator: str):
    """(the node every run is planned on, the accelerator `auto` resolves to, the region's bandwidth probe samples or
    None): this machine, under the cap its cgroups make, with a given region's probed bandwidth."""
    from memascend_cli.hardware import resolve_hardware

    hw = resolve_hardware(None, None)
    if dram_cap_bytes is not None:
        hw = hw.under_dram_cap(dram_cap_bytes)  # every run's plan is of the node its cgroup makes
    probe_samples = None
    if region is not None and os.path.exists(region):
        from memascend_cli.ssd.path import apply_region, region_header

        hw = apply_region(hw, region)  # its probed bandwidth, when prepare-ssd measured one
        probe = getattr(region_header(region), "probe", None)
        probe_samples = probe.sample_rows() if probe is not None and probe.samples else None
    if accelerator == "auto":
        accelerator = "cuda" if hw.num_gpus > 0 else "cpu"
    if accelerator == "cpu" and hw.num_gpus > 0:
        hw = dataclasses.replace(hw, num_gpus=0)  # the planner then models a CPU-only job, as the runs are
    return hw, accelerator, probe_samples


def timing(hw, dtype: str, cpu_gflops: float | None, ssd_bytes_per_s: int | None,
           probe_samples: list | None = None, num_members: int = 1) -> dict:
    """The time model's inputs for the runs' predicted s/step: the compute device as `plan` resolves it, and the SSD
    bandwidth each run gets: the throttle where it is below the drive's (a drive of unknown speed is taken to be
    faster), else the drive's as prepare-ssd probed it (a region given with --region; runner.with_region_rates adds
    those of a region the bench creates), else unknown. The probe's
    every setting ([block bytes, queue depth, write GB/s, read GB/s]) goes along: the engines do not all issue
    requests of its best setting's size and depth."""
    from memascend_cli.compute_probe import plan_device
    from memascend_cli.hardware import local_cpu_model

    cpu_model = local_cpu_model()
    device = plan_device(hw, dtype, cpu_gflops=cpu_gflops, cpu_model=cpu_model)
    read, write = hw.nvme_read_gbps, hw.nvme_write_gbps
    source = "the region's probe" if read else None
    if ssd_bytes_per_s is not None:
        # Every member of a striped region has the limit (folders): the region's is their sum. The stock runs'
        # swap folder is one device: their prediction is then optimistic.
        limit = ssd_bytes_per_s * max(1, num_members) / 1e9
        read, write = min(read or limit, limit), min(write or limit, limit)
        source = "--ssd-bandwidth"
    # A throttle limits reads and writes separately (planner/time.py step_time duplex_io).
    return {"device": device, "read_gbps": read, "write_gbps": write, "source": source, "cpu_model": cpu_model,
            "duplex_io": ssd_bytes_per_s is not None, "probe_samples": probe_samples}


def engine_ready(run_specs) -> bool:
    """Whether the memascend runs can start (a warning when they cannot: the other engines still run)."""
    from memascend_cli.console import warn
    from memascend_cli.run.prepared import engine_available

    if not any(r.mode == "memascend" for r in run_specs):
        return True
    ok, why = engine_available()
    if not ok:
        warn(f"memascend runs will fail: {why}")
    return ok


def sitting_meta(title: str | None) -> dict:
    """The sitting's record in every document: the command as typed, when, where, and the --title."""
    import shlex
    import socket
    import sys
    from datetime import datetime, timezone

    return {"command": "memascend bench " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "host": socket.gethostname(),
            **({"title": title} if title else {})}


def run_sweep(template, points: list[tuple[int, int]], run_specs, *, layers_given: bool, out_dir: str, meta: dict,
              show_tables: bool, placement: str | None = None, **run_kw) -> tuple[dict, bool]:
    """Every (layers, seq_len) point of `template`'s job: its runs (runner.run_point with `run_kw`; with `placement`
    each run placed there, bench.placements.run_choices), bench.json and bench.png in its folder (OUT itself for one
    point), its table unless `show_tables` is off; with several points sweep.json in OUT. (the document to print,
    whether every run finished)."""
    from memascend_cli.bench import document, runner
    from memascend_cli.console import err

    docs, all_ok = [], True
    base_spec = template.spec
    for L, s in points:
        spec = base_spec if L == base_spec.num_hidden_layers else base_spec.scaled(L)
        point_dir = out_dir if len(points) == 1 else os.path.join(out_dir, f"layers{L}-seq{s}")
        os.makedirs(point_dir, exist_ok=True)
        point = dataclasses.replace(template, spec=spec, layers=L if layers_given else None, seq_len=s)
        kw = run_kw
        if placement is not None:
            from memascend_cli.bench.placements import run_choices
            from memascend_cli.run.train_placement import dram_tier_supported

            kw = {**run_kw, "placements": run_choices(point, run_specs, placement), "dram_tier": dram_tier_supported()}
        doc = runner.run_point(point, run_specs, out_dir=point_dir, **kw)
        doc["meta"] = meta
        problem = document.write_plot(doc, os.path.join(point_dir, "bench.png"))
        if problem:
            doc["notes"].append(problem)
        summary = document.write_document(doc, os.path.join(point_dir, "bench.json"))
        docs.append(doc)
        all_ok = all_ok and all(r["ok"] for r in doc["runs"])
        if show_tables:
            document.render_table(doc)
    result = summary
    if len(points) > 1:
        sweep = document.sweep_document(docs)
        sweep["meta"] = meta
        result = document.write_document(sweep, os.path.join(out_dir, "sweep.json"))
        if show_tables:
            document.render_sweep(result)
    if show_tables:
        err.print(f"wrote {out_dir}")
    return result, all_ok
