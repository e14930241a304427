"""The kit's phases other than the bench: the first seconds' probe of what the machine can do, setup (a private
venv over the image's Python, installs from the carry folder, the native core and DeepSpeed's ops), the
storage probe, the CUDA runtime constants, `pytest -m gpu` and the 1B-class bench test."""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import shutil
import subprocess

from gpukit.kit import Kit, StepRecord, base_site_dirs, extract_deb
from gpukit.pure import (BUILD_REQUIREMENTS, DEEPSPEED_VERSION, GVISOR_KERNEL, PYTHON_TARGET, REPO, VALIDATE_MODEL,
                         VALIDATE_TEST, GiB, MiB, compiler_errors, parse_dd_gbps, parse_junit)

SCRIPTS = os.path.join(REPO, "scripts")


# -- the first seconds -------------------------------------------------------------------------------------------

IO_URING_SETUP = 425
"""io_uring_setup's system call number on x86-64 (and every architecture since Linux 5.1's unified table)."""


def io_uring_works() -> tuple[bool, str]:
    """Whether the kernel creates an io_uring (gVisor and seccomp profiles may refuse it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    fd = libc.syscall(IO_URING_SETUP, 4, params)
    if fd >= 0:
        os.close(fd)
        return True, "io_uring_setup ok"
    e = ctypes.get_errno()
    return False, f"io_uring_setup: {errno.errorcode.get(e, e)}"


def o_direct_works(directory: str) -> tuple[bool, str]:
    """Whether an aligned 4 KiB O_DIRECT write goes through in `directory`."""
    path = os.path.join(directory, ".o_direct_probe")
    buf = mmap.mmap(-1, 4096)  # page-aligned
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o600)
        try:
            os.write(fd, buf)
        finally:
            os.close(fd)
        return True, "4 KiB O_DIRECT write ok"
    except OSError as exc:
        return False, f"O_DIRECT: {exc.strerror or exc}"
    finally:
        buf.close()
        if os.path.exists(path):
            os.unlink(path)


def loop_devices_work() -> tuple[bool, str]:
    """Whether a loop device can be had (root, /dev/loop-control, `losetup -f` finds a free one)."""
    if os.geteuid() != 0:
        return False, "not root"
    if not os.path.exists("/dev/loop-control"):
        return False, "no /dev/loop-control"
    try:
        r = subprocess.run(["losetup", "-f"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"losetup: {exc}"
    return (r.returncode == 0, (r.stdout or r.stderr).strip())


def probe_host(work: str) -> dict:
    """What this machine can do, in its first seconds (stdlib only: nothing is installed yet)."""
    release = os.uname().release
    host = {"kernel": release, "gvisor": release == GVISOR_KERNEL}
    for key, fn in (("io_uring", io_uring_works), ("o_direct", lambda: o_direct_works(work)),
                    ("loop_devices", loop_devices_work)):
        ok, why = fn()
        host[key], host[key + "_reason"] = ok, why
    return host


# -- setup -------------------------------------------------------------------------------------------------------

OP_BUILDS = (("op-async-io", "AsyncIOBuilder"), ("op-cpu-adam", "CPUAdamBuilder"))
"""DeepSpeed's ops every bench run needs: async_io (stock and tuned swap through it) and cpu_adam (all three)."""


def phase_setup(kit: Kit) -> bool:
    """Every call sets up as on a fresh machine: a venv over the image's Python, the carry folder's wheels, libaio,
    the ops (in the background) and the native core; a failed op build ends the kit here, its compiler's error
    in the log, instead of every bench run rebuilding it and failing."""
    base_py = kit.args.python
    if not kit.dry_run:
        shutil.rmtree(kit.venv, ignore_errors=True)
    r = kit.run("venv", [base_py, "-m", "venv", "--without-pip", kit.venv], cap_s=60)
    if r.status not in ("ok", "dry-run"):
        return False
    # The venv sees the image's packages (torch, transformers, pip, pytest...) through a .pth file, and
    # takes precedence over them: pip installs only what is missing or too old, into the venv.
    if kit.dry_run:
        print(f"[venv-pth] write {kit.venv}/lib/python{PYTHON_TARGET}/site-packages/zz_image.pth listing "
              f"the site-packages of {base_py}")
    else:
        site = subprocess.run([kit.py, "-c", "import site; print(site.getsitepackages()[0])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        with open(os.path.join(site, "zz_image.pth"), "w") as f:
            # addsitedir (not a bare path) also runs the .pth files of the image's site-packages.
            f.write("".join(f"import site; site.addsitedir({d!r})\n" for d in base_site_dirs(base_py)))
    wheels = os.path.join(kit.carry, "wheels")
    r = kit.run("pip-install", [kit.py, "-m", "pip", "install", "--no-index", "--find-links", wheels,
                                "--no-cache-dir", "--disable-pip-version-check", "--no-warn-script-location",
                                f"deepspeed=={DEEPSPEED_VERSION}", *BUILD_REQUIREMENTS], cap_s=180)
    if r.status not in ("ok", "dry-run"):
        return False
    aio = os.path.join(kit.work, "aio")
    deb_dir = os.path.join(kit.carry, "debs")
    debs = sorted(os.path.join(deb_dir, n) for n in os.listdir(deb_dir)) if os.path.isdir(deb_dir) else []
    if kit.dry_run:
        print(f"[aio-debs] unpack {', '.join(os.path.basename(d) for d in debs) or '(none)'} into {aio}")
    else:
        for d in debs:
            extract_deb(d, aio)
        kit.log(f"libaio unpacked into {aio}: "
                + ", ".join(sorted(os.listdir(os.path.join(aio, "usr", "lib", "x86_64-linux-gnu")))))
    # Ops first (the long pole, in the background), the native core meanwhile.
    probe = "from deepspeed.ops.op_builder import {b}; {b}().load(verbose=True); print('{b} loaded')"
    for name, builder in OP_BUILDS:
        kit.start(name, [kit.py, "-c", probe.format(b=builder)])
    r = kit.run("native-build", [kit.py, "-m", "pip", "install", "--no-index", "--no-deps", "--no-build-isolation",
                                 "--no-cache-dir", "--disable-pip-version-check", "--no-warn-script-location", "-e",
                                 REPO], cap_s=240, cwd=REPO)
    ops_ok = True
    for name, _ in OP_BUILDS:
        rec = kit.join(name)
        if rec is not None and rec.status != "ok":
            ops_ok = False
            with open(os.path.join(kit.work, "logs", f"{name}.log"), errors="replace") as f:
                errors = compiler_errors(f.read())
            kit.summary.setdefault("op_build_errors", {})[name] = errors
            kit.log(f"{name} FAILED: the kit stops here (every bench run would rebuild it and fail). The build's "
                    "errors:\n    " + "\n    ".join(errors or ["(no error line found; its log is above)"]))
    if not ops_ok or r.status not in ("ok", "dry-run"):
        return False
    code = ("import json, torch; from memascend_engine import native; import deepspeed\n"
            "from deepspeed.accelerator import get_accelerator as g\n"
            "print(json.dumps({'native': native.available(), 'cuda_runtime': native.cuda_runtime_status() "
            "if native.available()[0] else None, 'torch': torch.__version__, 'torch_cuda': torch.version.cuda, "
            "'cuda_available': torch.cuda.is_available(), 'deepspeed': deepspeed.__version__, "
            "'accelerator': g().device_name(), 'backend': g().communication_backend_name()}))")
    facts_path = os.path.join(kit.work, "logs", "import-check.json")
    r2 = kit.run("import-check", [kit.py, "-c", code], cap_s=90, cwd="/", stdout_path=facts_path)
    if not kit.dry_run and r2.status == "ok":
        with open(facts_path) as f:
            kit.facts["installed"] = json.load(f)
        kit.log("installed: " + json.dumps(kit.facts["installed"]))
    return r2.status in ("ok", "dry-run")


# -- storage probe -----------------------------------------------------------------------------------------------


def _inspect_path(kit: Kit, path: str) -> dict | None:
    rc, out, err = kit.capture([kit.py, "-m", "memascend_cli", "inspect", "--nvme-path", path, "--json"], timeout=120)
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        kit.log(f"inspect --nvme-path {path} failed (rc {rc}): {err.strip()[-400:]}")
        return None


def _loop_fallback(kit: Kit, size_bytes: int) -> dict | None:
    """An ext4 file system on a loop device over a sparse file in WORK (root): O_DIRECT works there even
    when the work directory's own file system (overlayfs, gVisor's) refuses it."""
    img = os.path.join(kit.work, "ssd.img")
    mnt = os.path.join(kit.work, "ssd-loop")
    os.makedirs(mnt, exist_ok=True)
    steps = [["truncate", "-s", str(size_bytes), img]]
    for cmd in steps:
        if kit.capture(cmd)[0] != 0:
            return None
    rc, dev, err = kit.capture(["losetup", "-f", "--show", img])
    if rc != 0:
        kit.log(f"loop fallback: losetup failed: {err.strip()}")
        return None
    dev = dev.strip()
    kit.storage["loop_device"] = dev
    for cmd in (["mkfs.ext4", "-q", "-F", "-E", "nodiscard", dev], ["mount", dev, mnt]):
        rc, _, err = kit.capture(cmd, timeout=300)
        if rc != 0:
            kit.log(f"loop fallback: {' '.join(cmd)} failed: {err.strip()}")
            kit.capture(["losetup", "-d", dev])
            kit.storage.pop("loop_device", None)
            return None
    kit.storage["loop_mount"] = mnt
    return _inspect_path(kit, mnt)


def _dd_speed(kit: Kit, path: str, nbytes: int = 1 * GiB) -> dict:
    f = os.path.join(path, "dd-probe.bin")
    count = str(nbytes // (4 * MiB))
    rc_w, _, err_w = kit.capture(["dd", "if=/dev/zero", f"of={f}", "bs=4M", f"count={count}", "oflag=direct",
                                  "conv=fsync"], timeout=120)
    rc_r, _, err_r = kit.capture(["dd", f"if={f}", "of=/dev/null", "bs=4M", "iflag=direct"], timeout=120)
    try:
        os.unlink(f)
    except OSError:
        pass
    return {"write_gbps": parse_dd_gbps(err_w) if rc_w == 0 else None,
            "read_gbps": parse_dd_gbps(err_r) if rc_r == 0 else None}


def _region_probe(kit: Kit, path: str) -> dict:
    """memascend's own probe (prepare-ssd on a 2 GiB region file: O_DIRECT at several block sizes and queue depths,
    as the engines do I/O), which the time model takes for the SSD; dd's single 4 MiB request in flight reads
    low (the H200 call of 2026-11-26: dd 1.4-1.5 GB/s where the engines moved more)."""
    f = os.path.join(path, "probe.region")
    cli = [kit.py, "-m", "memascend_cli", "prepare-ssd"]
    rc, _, err = kit.capture(cli + [f, "--size", "2GiB", "--yes"], timeout=120)
    probe = None
    if rc == 0:
        rc, out, err = kit.capture(cli + ["--info", f, "--json"], timeout=60)
        probe = (json.loads(out).get("header") or {}).get("probe") if rc == 0 else None
    kit.capture(cli + ["--wipe", f, "--yes"], timeout=60)
    if not probe:
        return {"region_probe": {"error": err.strip()[-300:]}}
    # The samples (GB/s per block size and queue depth) stay: the forward / backward parameter fetches keep fewer
    # requests in flight than the best, and the time model's fetch rate is to be checked against them.
    return {"region_probe": probe}


def phase_probe(kit: Kit) -> bool:
    target = os.path.join(kit.work, "ssd")
    if kit.dry_run:
        print(f"[probe] $ {kit.py} -m memascend_cli inspect --nvme-path {target} --json   (O_DIRECT, io_uring, "
              "libaio; if O_DIRECT fails: truncate + losetup -f + mkfs.ext4 + mount under .gpu_work/ssd-loop)")
        print(f"[probe] native IOEngine(backend='auto') on {target}: io_uring, else the thread pool (reported)")
        print(f"[probe] $ dd if=/dev/zero of={target}/dd-probe.bin bs=4M count=256 oflag=direct conv=fsync; dd ... "
              "iflag=direct (GB/s for the time budget)")
        print(f"[probe] $ {kit.py} -m memascend_cli prepare-ssd {target}/probe.region --size 2GiB --yes; "
              "--info --json; --wipe --yes (the time model's SSD rates)")
        kit.storage = {"dir": target, "kind": "dry-run"}
        return True
    os.makedirs(target, exist_ok=True)
    info = _inspect_path(kit, target)
    path_info = (info or {}).get("path") or {}
    kit.storage = {"dir": target, "kind": "work directory", "fstype": path_info.get("fstype"),
                   "o_direct_ok": path_info.get("o_direct_ok"), "o_direct_reason": path_info.get("o_direct_reason"),
                   "free_bytes": path_info.get("free_bytes"), "io_backends": (info or {}).get("io_backends")}
    if not path_info.get("o_direct_ok"):
        free = path_info.get("free_bytes") or shutil.disk_usage(kit.work).free
        size = max(8 * GiB, min(free - 4 * GiB, 56 * GiB))
        kit.log(f"O_DIRECT refused on {target} ({path_info.get('fstype')}: {path_info.get('o_direct_reason')}); "
                f"trying an ext4 loop device of {size / GiB:.0f} GiB")
        loop = _loop_fallback(kit, int(size))
        lp = (loop or {}).get("path") or {}
        if lp.get("o_direct_ok"):
            kit.storage.update({"dir": kit.storage["loop_mount"], "kind": f"ext4 on {kit.storage['loop_device']} "
                                f"(loop over {target}'s file system)", "fstype": lp.get("fstype"),
                                "o_direct_ok": True, "o_direct_reason": lp.get("o_direct_reason"),
                                "free_bytes": lp.get("free_bytes")})
        else:
            kit.storage["kind"] = "none: no O_DIRECT-capable directory (bench and SSD tests will fail or skip)"
    code = ("import json, os, sys; from memascend_engine import native\n"
            "p = os.path.join(sys.argv[1], 'engine-probe.bin'); open(p, 'wb').truncate(8 << 20)\n"
            "e = native.IOEngine(p, backend='auto'); print(json.dumps({'backend': e.backend, "
            "'reason': e.backend_reason})); os.unlink(p)")
    rc, out, err = kit.capture([kit.py, "-c", code, kit.ssd])
    kit.storage["native_io_backend"] = json.loads(out) if rc == 0 else {"error": err.strip()[-300:]}
    kit.storage.update(_dd_speed(kit, kit.ssd))
    kit.storage.update(_region_probe(kit, kit.ssd))
    kit.log("storage: " + json.dumps(kit.storage))
    return bool(kit.storage.get("o_direct_ok"))




# -- the CUDA runtime constants ------------------------------------------------------------------------------------

CONSTANTS_FILE = "cuda_constants.json"
"""In the output folder; `MEMASCEND_CUDA_CONSTANTS=<it> memascend plan ...` (memascend_cli/planner/measured.py ENV)
takes the planner's CUDA constants from it."""


def phase_constants(kit: Kit) -> bool:
    out = os.path.join(kit.out_dir, CONSTANTS_FILE)
    r = kit.run("cuda-constants", [kit.py, os.path.join(SCRIPTS, "gpukit", "cuda_constants.py"), out], cap_s=120,
                cwd="/", env={"DS_ACCELERATOR": "cuda"}, echo_lines=40)
    if not kit.dry_run and r.status == "ok":
        with open(out) as f:
            kit.summary["cuda_constants"] = json.load(f)
        # The bench's predictions in this call then hold the measured runtime, not the planner's typical value.
        kit.env["MEMASCEND_CUDA_CONSTANTS"] = out
        kit.log(f"later steps plan with MEMASCEND_CUDA_CONSTANTS={out}")
    return r.status in ("ok", "dry-run")


# -- pytest -m gpu -----------------------------------------------------------------------------------------------


def phase_tests(kit: Kit) -> bool:
    kit.run("ds-report", [kit.py, "-c", "from deepspeed.env_report import cli_main; cli_main()"], cap_s=60,
            echo_lines=80)
    junit = os.path.join(kit.out_dir, "pytest_gpu.xml")
    base = os.path.join(kit.ssd, "pytest")
    r = kit.run("pytest-gpu", [kit.py, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-rA", "-q",
                               f"--basetemp={base}", f"--junitxml={junit}", "--deselect", VALIDATE_TEST, "tests"],
                cap_s=kit.args.tests_cap_s, cwd=REPO)
    if not kit.dry_run:
        kit.summary["pytest_gpu"] = parse_junit(junit)
        shutil.rmtree(base, ignore_errors=True)
    return r.status in ("ok", "dry-run")


# -- the 1B-class bench test on the bench's own output ----------------------------------------------------------


def phase_validate(kit: Kit) -> bool:
    bench_dir = os.path.join(kit.ssd, "bench", VALIDATE_MODEL)
    if not kit.dry_run and not os.path.isdir(bench_dir):
        kit.log(f"validate: skipped, no bench output of {VALIDATE_MODEL} in this call")
        kit.steps.append(StepRecord("validate", "skipped", note=f"no bench of {VALIDATE_MODEL}"))
        return False
    r = kit.run("validate-bench", [kit.py, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "-q", VALIDATE_TEST],
                cap_s=120, cwd=REPO, env={"MEMASCEND_GPU_BENCH_DIR": bench_dir})
    return r.status in ("ok", "dry-run")
