"""The machine a job runs on: probe this one, or load a hardware profile, then apply overrides.

`probe()` gathers everything `memascend inspect` shows (an Inventory); `inventory_to_spec()` keeps
what the planner needs (a HardwareSpec). Profiles (presets/hardware/*.yaml) describe machines
other than this one. Nothing here imports torch: GPUs are found through NVML or nvidia-smi.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import errno
import mmap
import os
import platform
import resource
import shutil
import stat
import struct
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from memascend_cli.ssd.blockdev import (
    BlockDevice,
    device_for_path,
    find_block_device,
    list_block_devices,
    mount_for_path,
    read_mountinfo,
)
from memascend_cli.errors import BadInput, PresetNotFound, did_you_mean
from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.units import GiB, parse_bandwidth_gbps, parse_size

# O_DIRECT probe sizes: 4096 B satisfies every common logical block size (512e and 4Kn); 1000 B
# is a multiple of nothing, so a filesystem that enforces direct I/O must reject it with EINVAL.
_PROBE_BYTES = 4096
_UNALIGNED_PROBE_BYTES = 1000

# statx(2) and io_uring_setup(2) by syscall number: Python 3.11 wraps neither. io_uring_setup is
# 425 on every architecture (syscalls numbered from 424 up are shared); statx is not.
_SYS_STATX = {"x86_64": 332, "aarch64": 291}
_SYS_IO_URING_SETUP = 425
_STATX_DIOALIGN = 0x2000
_STATX_BUF_BYTES = 256
# Offsets in struct statx (include/uapi/linux/stat.h): stx_mask at 0, stx_dio_mem_align at 152.
_STATX_DIO_OFFSET = 152
_AT_FDCWD = -100
# struct io_uring_params is 120 bytes; zeroed means "default ring".
_IO_URING_PARAMS_BYTES = 120

# CAP_IPC_LOCK lets a process mlock beyond RLIMIT_MEMLOCK (capabilities(7)).
_CAP_IPC_LOCK_BIT = 14

_NVIDIA_SMI_TIMEOUT_S = 5.0
_INCLUDE_DIRS = ("/usr/include", "/usr/local/include")

MEMINFO = "/proc/meminfo"
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
IO_URING_DISABLED = "/proc/sys/kernel/io_uring_disabled"


@dataclass
class PathInfo:
    """Where swap data would go (--nvme-path): its filesystem, space, and direct-I/O behaviour."""

    path: str
    exists: bool
    fstype: str | None
    """Filesystem of the mount holding the path ('ext4', 'xfs', 'tmpfs'), or the device's own."""
    free_bytes: int | None
    """Space a non-root user may still write; for a raw device, its size if nothing is on it, else 0."""
    total_bytes: int | None
    o_direct_ok: bool | None
    """True: O_DIRECT works and is enforced. False: refused or not enforced. None: could not test."""
    o_direct_reason: str
    dio_mem_align: int | None
    """Buffer address alignment for O_DIRECT (statx STATX_DIOALIGN), None if the kernel does not say."""
    dio_offset_align: int | None
    """File offset and length alignment for O_DIRECT, None if the kernel does not say."""
    is_block_device: bool
    device: str | None
    """The block device backing the path ('/dev/nvme0n1p2'), None for tmpfs, overlay, NFS, ..."""

    def to_dict(self) -> dict:
        """Plain dict for JSON output."""
        return asdict(self)


@dataclass
class Inventory:
    """Everything `memascend inspect` reports about this machine."""

    dram_total_gib: float
    dram_available_gib: float
    swap_total_gib: float
    memlock_soft_bytes: int | None
    """RLIMIT_MEMLOCK soft limit; None = unlimited."""
    memlock_hard_bytes: int | None
    is_root: bool
    cap_ipc_lock: bool
    """The process may lock any amount of memory whatever RLIMIT_MEMLOCK says."""
    hugepages_total: int
    """Reserved hugetlb pages (HugePages_Total); MAP_HUGETLB needs these."""
    hugepage_size_kib: int
    thp_mode: str | None
    """Transparent huge pages: 'always', 'madvise' or 'never'."""
    cpu_cores: int
    """Logical CPUs this process may run on."""
    cpu_model: str | None
    gpus: list[dict]
    block_devices: list[BlockDevice]
    path: PathInfo | None
    io_backends: dict
    kernel: str

    def to_dict(self) -> dict:
        """Plain dict for JSON output (nested dataclasses become dicts)."""
        return asdict(self)


def parse_meminfo(text: str) -> dict[str, int]:
    """Parse /proc/meminfo: values given in kB become bytes, unitless ones (HugePages_*) stay counts."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not parts:
            continue
        try:
            number = int(parts[0])
        except ValueError:
            continue
        # The kernel writes "kB" and means KiB.
        values[key.strip()] = number * 1024 if len(parts) > 1 and parts[1] == "kB" else number
    return values


def parse_nvidia_smi_csv(text: str) -> list[dict]:
    """Parse `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits` (MiB)."""
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3 or not fields[0].isdigit():
            continue
        try:
            memory_mib = float(fields[2])
        except ValueError:
            continue
        gpus.append({"index": int(fields[0]), "name": fields[1], "memory_gib": round(memory_mib / 1024, 2)})
    return gpus


def _probe_gpus_nvml() -> list[dict] | None:
    import importlib.util

    if importlib.util.find_spec("pynvml") is None:
        return None
    import pynvml

    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError subclasses: no driver, no library; fall back to nvidia-smi.
        return None
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            memory_bytes = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            gpus.append({
                "index": index,
                # Older nvidia-ml-py returns bytes.
                "name": name.decode() if isinstance(name, bytes) else str(name),
                "memory_gib": round(memory_bytes / GiB, 2),
            })
        return gpus
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()


def _probe_gpus_smi() -> list[dict] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run(
            [exe, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=_NVIDIA_SMI_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_nvidia_smi_csv(proc.stdout) if proc.returncode == 0 else None


def probe_gpus() -> list[dict]:
    """NVIDIA GPUs as [{"index", "name", "memory_gib"}]: NVML if installed, else nvidia-smi, else []."""
    gpus = _probe_gpus_nvml()
    if gpus is None:
        gpus = _probe_gpus_smi()
    return gpus or []


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def statx_dioalign(path: str) -> tuple[int | None, int | None]:
    """(dio_mem_align, dio_offset_align) from statx(STATX_DIOALIGN); (None, None) if unavailable.

    Needs Linux >= 6.1 and a filesystem that reports it (ext4, xfs, block devices since 6.11);
    (0, 0) means the kernel says the file does not support direct I/O.
    """
    nr = _SYS_STATX.get(platform.machine())
    if nr is None:
        return None, None
    buf = ctypes.create_string_buffer(_STATX_BUF_BYTES)
    rc = _libc().syscall(
        ctypes.c_long(nr), ctypes.c_int(_AT_FDCWD), ctypes.c_char_p(os.fsencode(path)),
        ctypes.c_int(0), ctypes.c_uint(_STATX_DIOALIGN), buf,
    )
    if rc != 0:
        return None, None
    (mask,) = struct.unpack_from("=I", buf, 0)
    if not mask & _STATX_DIOALIGN:
        return None, None
    mem_align, offset_align = struct.unpack_from("=II", buf, _STATX_DIO_OFFSET)
    return mem_align, offset_align


def _o_direct_roundtrip(fd: int, probe_bytes: int, writable: bool, fstype: str | None) -> tuple[bool, str]:
    """Aligned I/O must succeed and an unaligned length must fail, or O_DIRECT is not really in effect."""
    # Anonymous mmap memory is page aligned, which satisfies any DIO memory alignment.
    pattern = bytes(range(256)) * (probe_bytes // 256)
    out_buf, in_buf = mmap.mmap(-1, probe_bytes), mmap.mmap(-1, probe_bytes)
    try:
        out_buf.write(pattern)
        if writable:
            written = os.pwritev(fd, [out_buf], 0)
            if written != probe_bytes:
                return False, f"aligned O_DIRECT write returned {written} of {probe_bytes} B"
        read = os.preadv(fd, [in_buf], 0)
        if read != probe_bytes:
            return False, f"aligned O_DIRECT read returned {read} of {probe_bytes} B"
        if writable and in_buf[:] != pattern:
            return False, "O_DIRECT read back different bytes than were written"
        view = memoryview(out_buf if writable else in_buf)
        part = view[:_UNALIGNED_PROBE_BYTES]
        try:
            if writable:
                os.pwritev(fd, [part], 0)
            else:
                os.preadv(fd, [part], 0)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                op = "write" if writable else "read"
                return True, (
                    f"aligned {probe_bytes} B round-trip OK, "
                    f"unaligned {_UNALIGNED_PROBE_BYTES} B {op} rejected (EINVAL)"
                )
            return True, f"aligned {probe_bytes} B round-trip OK, unaligned I/O failed: {exc.strerror}"
        finally:
            part.release()
            view.release()
        fs = fstype or "this filesystem"
        why = "it keeps files in RAM, so it is not an SSD" if fstype == "tmpfs" else "I/O goes through the page cache"
        return False, (
            f"{fs} accepts O_DIRECT without enforcing alignment "
            f"(an unaligned {_UNALIGNED_PROBE_BYTES} B I/O succeeded): {why}"
        )
    finally:
        out_buf.close()
        in_buf.close()


def _probe_o_direct_dir(directory: str, fstype: str | None) -> tuple[bool | None, str, int | None, int | None]:
    """O_DIRECT probe with a temporary file in `directory`; also returns its statx DIO alignment."""
    try:
        fd_tmp, tmp_path = tempfile.mkstemp(prefix=".memascend-odirect-", dir=directory)
    except OSError as exc:
        return None, f"cannot create a probe file in {directory}: {exc.strerror}", None, None
    os.close(fd_tmp)
    try:
        # ext4 and xfs report DIO alignment only for regular files, so ask about the probe file.
        mem_align, offset_align = statx_dioalign(tmp_path)
        try:
            fd = os.open(tmp_path, os.O_RDWR | os.O_DIRECT)
        except OSError as exc:
            return False, f"{fstype or 'filesystem'} refuses O_DIRECT: {exc.strerror}", mem_align, offset_align
        try:
            ok, reason = _o_direct_roundtrip(fd, max(_PROBE_BYTES, offset_align or 0), True, fstype)
        except OSError as exc:
            ok, reason = False, f"aligned O_DIRECT I/O failed: {exc.strerror}"
        finally:
            os.close(fd)
        return ok, reason, mem_align, offset_align
    finally:
        os.unlink(tmp_path)


def _probe_o_direct_device(device_path: str, size_bytes: int, block_bytes: int) -> tuple[bool | None, str]:
    """Read-only O_DIRECT probe of a block device: its data is never written."""
    probe_bytes = max(_PROBE_BYTES, block_bytes)
    if size_bytes < probe_bytes:
        return None, f"device is smaller than {probe_bytes} B"
    try:
        fd = os.open(device_path, os.O_RDONLY | os.O_DIRECT)
    except OSError as exc:
        return None, f"cannot open {device_path}: {exc.strerror}"
    try:
        return _o_direct_roundtrip(fd, probe_bytes, False, None)
    except OSError as exc:
        return False, f"aligned O_DIRECT read failed: {exc.strerror}"
    finally:
        os.close(fd)


def _path_info_block_device(path: str, real: str) -> PathInfo:
    dev = find_block_device(real)
    size_bytes = dev.size_bytes if dev is not None else None
    block_bytes = dev.logical_block_bytes if dev is not None else _PROBE_BYTES
    in_use = dev is not None and bool(dev.mountpoints or dev.fstype or dev.children or dev.holders)
    ok, reason = _probe_o_direct_device(real, size_bytes or 0, block_bytes)
    mem_align, offset_align = statx_dioalign(real)
    return PathInfo(
        path=path,
        exists=True,
        fstype=dev.fstype if dev is not None else None,
        # A device that carries a filesystem, partitions or stacked devices is not free for raw use.
        free_bytes=(0 if in_use else size_bytes),
        total_bytes=size_bytes,
        o_direct_ok=ok,
        o_direct_reason=reason,
        dio_mem_align=mem_align,
        # Block devices accept any multiple of the logical block size; older kernels do not report it.
        dio_offset_align=offset_align if offset_align is not None else (dev.logical_block_bytes if dev else None),
        is_block_device=True,
        device=dev.path if dev is not None else real,
    )


def path_info(path: str) -> PathInfo:
    """Filesystem type, free space and O_DIRECT behaviour of a swap location.

    A directory is probed with a temporary file written and read with O_DIRECT; a regular file
    through its directory; a block device read-only. A missing path gives exists=False and no probe.
    """
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return PathInfo(
            path=path, exists=False, fstype=None, free_bytes=None, total_bytes=None, o_direct_ok=None,
            o_direct_reason="path does not exist", dio_mem_align=None, dio_offset_align=None,
            is_block_device=False, device=None,
        )
    if stat.S_ISBLK(st.st_mode):
        return _path_info_block_device(path, real)
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        # A character device, FIFO or socket: never drop a probe file next to it (e.g. into /dev).
        return PathInfo(
            path=path, exists=True, fstype=None, free_bytes=None, total_bytes=None, o_direct_ok=None,
            o_direct_reason="not a directory, regular file or block device", dio_mem_align=None,
            dio_offset_align=None, is_block_device=False, device=None,
        )
    directory = real if stat.S_ISDIR(st.st_mode) else os.path.dirname(real)
    try:
        mount = mount_for_path(real, read_mountinfo())
    except OSError:
        mount = None
    fstype = mount.fstype if mount is not None else None
    vfs = os.statvfs(directory)
    ok, reason, mem_align, offset_align = _probe_o_direct_dir(directory, fstype)
    if stat.S_ISREG(st.st_mode):
        # The region file itself is what the engine opens; its alignment is the one that counts.
        mem_align, offset_align = statx_dioalign(real)
    dev = device_for_path(real)
    return PathInfo(
        path=path,
        exists=True,
        fstype=fstype,
        free_bytes=vfs.f_bavail * vfs.f_frsize,
        total_bytes=vfs.f_blocks * vfs.f_frsize,
        o_direct_ok=ok,
        o_direct_reason=reason,
        dio_mem_align=mem_align,
        dio_offset_align=offset_align,
        is_block_device=False,
        device=dev.path if dev is not None else None,
    )


def _header_present(header: str) -> bool:
    dirs = list(_INCLUDE_DIRS)
    if os.environ.get("CONDA_PREFIX"):
        dirs.append(os.path.join(os.environ["CONDA_PREFIX"], "include"))
    return any(os.path.exists(os.path.join(d, header)) for d in dirs)


def _io_uring_status() -> dict:
    disabled = None
    try:
        with open(IO_URING_DISABLED, encoding="utf-8") as f:
            disabled = int(f.read().strip())
    except (OSError, ValueError):
        pass  # Kernels before 6.6 have no switch: io_uring is then on unless compiled out.
    header = _header_present("liburing.h")
    if disabled == 2:
        return {"available": False, "reason": "disabled by sysctl kernel.io_uring_disabled=2", "dev_header": header}
    params = ctypes.create_string_buffer(_IO_URING_PARAMS_BYTES)
    fd = _libc().syscall(ctypes.c_long(_SYS_IO_URING_SETUP), ctypes.c_uint(1), params)
    if fd < 0:
        code = ctypes.get_errno()
        if code == errno.ENOSYS:
            why = "kernel has no io_uring (ENOSYS)"
        elif code == errno.EPERM:
            why = (
                f"io_uring_setup not permitted (EPERM): sysctl io_uring_disabled={disabled} "
                "or a seccomp/container policy"
            )
        else:
            why = f"io_uring_setup failed: {os.strerror(code)}"
        return {"available": False, "reason": why, "dev_header": header}
    os.close(fd)
    return {"available": True, "reason": "io_uring_setup succeeded", "dev_header": header}


def _libaio_status() -> dict:
    header = _header_present("libaio.h")
    name = ctypes.util.find_library("aio") or "libaio.so.1"
    try:
        ctypes.CDLL(name)
    except OSError:
        return {
            "available": False,
            "reason": "libaio is not installed (apt-get install libaio1 libaio-dev)",
            "library": None,
            "dev_header": header,
        }
    if header:
        why = f"{name} loads and libaio.h is present"
    else:
        why = f"{name} loads but libaio.h is missing: DeepSpeed's async_io op cannot build (apt-get install libaio-dev)"
    return {"available": True, "reason": why, "library": name, "dev_header": header}


def io_backends() -> dict:
    """Whether io_uring and libaio can be used here, each with a one-line reason."""
    return {"io_uring": _io_uring_status(), "libaio": _libaio_status()}


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _has_capability(status_text: str, bit: int) -> bool:
    for line in status_text.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return False


def _thp_mode(text: str | None) -> str | None:
    # The active choice is bracketed: "always [madvise] never".
    if not text:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def _cpu_model(cpuinfo: str | None) -> str | None:
    for line in (cpuinfo or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "cpu model") and value.strip():
            return value.strip()
    return platform.processor() or None


def local_cpu_model() -> str | None:
    """This machine's CPU model name (/proc/cpuinfo), without the rest of the probe."""
    return _cpu_model(_read_text("/proc/cpuinfo"))


def _memlock_limit(value: int) -> int | None:
    return None if value == resource.RLIM_INFINITY else value


def probe(nvme_path: str | None = None) -> Inventory:
    """Inspect this machine: memory, limits, CPUs, GPUs, block devices, I/O backends and `nvme_path`."""
    meminfo = parse_meminfo(_read_text(MEMINFO) or "")
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    try:
        cpu_cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpu_cores = os.cpu_count() or 1
    return Inventory(
        dram_total_gib=round(meminfo.get("MemTotal", 0) / GiB, 2),
        dram_available_gib=round(meminfo.get("MemAvailable", 0) / GiB, 2),
        swap_total_gib=round(meminfo.get("SwapTotal", 0) / GiB, 2),
        memlock_soft_bytes=_memlock_limit(soft),
        memlock_hard_bytes=_memlock_limit(hard),
        is_root=os.geteuid() == 0,
        cap_ipc_lock=_has_capability(_read_text("/proc/self/status") or "", _CAP_IPC_LOCK_BIT),
        hugepages_total=meminfo.get("HugePages_Total", 0),
        hugepage_size_kib=meminfo.get("Hugepagesize", 0) // 1024,
        thp_mode=_thp_mode(_read_text(THP_ENABLED)),
        cpu_cores=cpu_cores,
        cpu_model=local_cpu_model(),
        gpus=probe_gpus(),
        block_devices=list_block_devices(),
        path=path_info(nvme_path) if nvme_path is not None else None,
        io_backends=io_backends(),
        kernel=platform.release(),
    )


def inventory_to_spec(inv: Inventory) -> HardwareSpec:
    """The planner's view of a probed machine (bandwidths stay unknown until `prepare-ssd` measures)."""
    gpus = inv.gpus
    return HardwareSpec(
        name="local",
        dram_gib=inv.dram_total_gib,
        dram_available_gib=inv.dram_available_gib,
        swap_gib=inv.swap_total_gib,
        num_gpus=len(gpus),
        gpu_name=gpus[0]["name"] if gpus else None,
        # The planner assumes identical GPUs; with a mixed set, the smallest one bounds every rank.
        gpu_mem_gib=min(g["memory_gib"] for g in gpus) if gpus else 0.0,
        num_nodes=1,
        cpu_cores=inv.cpu_cores,
        memlock_limit_gib=inv.memlock_soft_bytes / GiB if inv.memlock_soft_bytes is not None else None,
        can_lock_unlimited=inv.cap_ipc_lock,
        nvme_path=inv.path.path if inv.path is not None else None,
        nvme_free_gib=(
            round(inv.path.free_bytes / GiB, 2) if inv.path is not None and inv.path.free_bytes is not None else None
        ),
        source="probe",
    )


def _profile_dir() -> Path:
    from memascend_presets import preset_dir

    return Path(str(preset_dir("hardware")))


def list_hardware_profiles() -> list[str]:
    """Names of the shipped hardware profiles (presets/hardware/<name>.yaml)."""
    return sorted(p.stem for p in _profile_dir().glob("*.yaml"))


_SPEC_FIELDS = {f.name: str(f.type) for f in dataclasses.fields(HardwareSpec)}


def _check_value(key: str, value, annotation: str) -> str | None:
    """Why `value` does not fit the HardwareSpec field annotation, or None if it does."""
    if value is None:
        return None if "None" in annotation else f"{key} must not be empty"
    base = annotation.split("|")[0].strip()
    if base == "bool":
        return None if isinstance(value, bool) else f"{key} must be true or false, got {value!r}"
    if base == "str":
        return None if isinstance(value, str) else f"{key} must be a string, got {value!r}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{key} must be a number, got {value!r}"
    if base == "int" and not isinstance(value, int):
        return f"{key} must be a whole number, got {value!r}"
    if value < 0:
        return f"{key} must not be negative, got {value!r}"
    return None


def _spec_from_mapping(data, source: str, default_name: str) -> HardwareSpec:
    if not isinstance(data, dict):
        raise BadInput(f"{source}: expected a mapping of HardwareSpec fields", "see presets/hardware/rtx4090-128g.yaml")
    problems = []
    for key, value in data.items():
        if key not in _SPEC_FIELDS:
            guess = did_you_mean(str(key), list(_SPEC_FIELDS))
            problems.append(f"unknown key {key!r}" + (f" (did you mean {guess!r}?)" if guess else ""))
        else:
            problem = _check_value(key, value, _SPEC_FIELDS[key])
            if problem:
                problems.append(problem)
    if "dram_gib" not in data:
        problems.append("dram_gib is required")
    elif not problems and data["dram_gib"] <= 0:
        problems.append(f"dram_gib must be positive, got {data['dram_gib']!r}")
    if not problems and data.get("num_nodes", 1) < 1:
        problems.append(f"num_nodes must be at least 1, got {data['num_nodes']!r}")
    if problems:
        raise BadInput(f"{source}: " + "; ".join(problems), "keys: " + ", ".join(_SPEC_FIELDS))
    fields = {"name": default_name, "source": f"profile {source}", **data}
    for key, value in data.items():
        # YAML reads `dram_gib: 128` as an int; keep float fields float so JSON output is uniform.
        if _SPEC_FIELDS[key].startswith("float") and isinstance(value, int):
            fields[key] = float(value)
    return HardwareSpec(**fields)


def load_hardware_profile(name_or_path: str) -> HardwareSpec:
    """Load a profile by name (presets/hardware/<name>.yaml) or from a .yaml path.

    Raises:
        PresetNotFound: no such profile or file (with a did-you-mean hint and the list).
        BadInput: the YAML is malformed or has unknown keys or wrong types.
    """
    import yaml

    candidate = Path(name_or_path).expanduser()
    is_path = name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path
    if is_path:
        if not candidate.is_file():
            raise PresetNotFound(
                f"hardware profile file {name_or_path} does not exist", "check the path, or give a profile name"
            )
        path = candidate
    else:
        path = _profile_dir() / f"{name_or_path}.yaml"
        if not path.is_file():
            names = list_hardware_profiles()
            guess = did_you_mean(name_or_path, names)
            hint = (f"did you mean {guess}? " if guess else "") + "available: " + ", ".join(names)
            raise PresetNotFound(f"unknown hardware profile {name_or_path!r}", hint)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise BadInput(f"{path}: not valid YAML ({exc})", "fix the syntax, e.g. `dram_gib: 128`") from None
    return _spec_from_mapping(data, str(path), path.stem)


def apply_overrides(
    spec: HardwareSpec,
    *,
    dram: str | None = None,
    gpu_mem: str | None = None,
    gpus: int | None = None,
    nodes: int | None = None,
    nvme_free: str | None = None,
    nvme_read_gbps: str | None = None,
    nvme_write_gbps: str | None = None,
    memlock: str | None = None,
) -> HardwareSpec:
    """Replace fields of `spec` with command-line values; sizes need units ('128GiB', '2TB').

    `memlock` takes a size or 'unlimited'; a size also means the limit binds (as for a user
    without CAP_IPC_LOCK).

    Raises:
        BadInput: a value without unit, negative, or unreadable; --gpus > 0 without GPU memory.
    """
    changes: dict = {}
    given: list[str] = []
    if dram is not None:
        changes["dram_gib"] = parse_size(dram, "--dram") / GiB
        # MemAvailable of this machine says nothing about the machine described now.
        changes["dram_available_gib"] = None
        given.append(f"--dram {dram}")
    if gpu_mem is not None:
        changes["gpu_mem_gib"] = parse_size(gpu_mem, "--gpu-mem") / GiB
        given.append(f"--gpu-mem {gpu_mem}")
    if gpus is not None:
        if gpus < 0:
            raise BadInput(f"--gpus must not be negative: {gpus}", "use --gpus 0 for a CPU-only job")
        changes["num_gpus"] = gpus
        given.append(f"--gpus {gpus}")
    if nodes is not None:
        if nodes < 1:
            raise BadInput(f"--nodes must be at least 1: {nodes}", "use --nodes 1 for a single machine")
        changes["num_nodes"] = nodes
        given.append(f"--nodes {nodes}")
    if nvme_free is not None:
        changes["nvme_free_gib"] = parse_size(nvme_free, "--nvme-free") / GiB
        given.append(f"--nvme-free {nvme_free}")
    if nvme_read_gbps is not None:
        changes["nvme_read_gbps"] = parse_bandwidth_gbps(nvme_read_gbps, "--nvme-read-gbps")
        given.append(f"--nvme-read-gbps {nvme_read_gbps}")
    if nvme_write_gbps is not None:
        changes["nvme_write_gbps"] = parse_bandwidth_gbps(nvme_write_gbps, "--nvme-write-gbps")
        given.append(f"--nvme-write-gbps {nvme_write_gbps}")
    if memlock is not None:
        if memlock.strip().lower() == "unlimited":
            changes["memlock_limit_gib"] = None
            changes["can_lock_unlimited"] = True
        else:
            changes["memlock_limit_gib"] = parse_size(memlock, "--memlock") / GiB
            changes["can_lock_unlimited"] = False
        given.append(f"--memlock {memlock}")
    if not changes:
        return spec
    new = dataclasses.replace(spec, **changes, source=f"{spec.source} + " + " ".join(given))
    if new.num_gpus > 0 and new.gpu_mem_gib <= 0:
        raise BadInput(f"--gpus {new.num_gpus} needs the memory per GPU", "add --gpu-mem, e.g. --gpu-mem 24GiB")
    if gpu_mem is not None and new.num_gpus == 0:
        raise BadInput("--gpu-mem has no effect without GPUs", "add --gpus N, e.g. --gpus 1 --gpu-mem 24GiB")
    return new


def require_existing_path(path: str, flag: str = "--nvme-path") -> None:
    """Raise BadInput unless `path` exists (a swap directory, region file or block device)."""
    if not os.path.exists(path):
        raise BadInput(
            f"{flag} {path} does not exist",
            f"create the directory first (`mkdir -p {path}`) or run `memascend prepare-ssd`",
        )


def resolve_hardware(hardware: str | None, nvme_path: str | None, *, default_nvme_path: str | None = None,
                     **overrides) -> HardwareSpec:
    """The HardwareSpec a plan uses: a profile (`--hardware`) or this machine, then overrides.

    With a profile, `nvme_path` is recorded but not probed: the profile describes another machine.

    Args:
        hardware: a profile name or .yaml path; None probes this machine.
        nvme_path: where swap data goes; must exist when probing this machine.
        default_nvme_path: where the run puts its SSD data when `nvme_path` is None (e.g. the region file `train`
            creates in the run directory): probed if it exists, else the free space of the file system it would be
            created on (nvme_path then names the folder checked).
        **overrides: keyword arguments of apply_overrides (dram, gpu_mem, gpus, ...).
    """
    if hardware is not None:
        spec = load_hardware_profile(hardware)
        if nvme_path is not None:
            spec = dataclasses.replace(spec, nvme_path=nvme_path)
    else:
        if nvme_path is None and default_nvme_path is not None and os.path.exists(default_nvme_path):
            nvme_path = default_nvme_path
        if nvme_path is not None:
            require_existing_path(nvme_path)
        spec = inventory_to_spec(probe(nvme_path))
        if nvme_path is not None:
            spec = apply_region(spec, nvme_path)
        elif default_nvme_path is not None:
            checked, free_bytes = free_space_at(default_nvme_path)
            spec = dataclasses.replace(spec, nvme_path=checked, nvme_free_gib=round(free_bytes / GiB, 2))
    return apply_overrides(spec, **overrides)


def free_space_at(path: str) -> tuple[str, int]:
    """(the nearest existing folder at or above `path`, the bytes a non-root user may still write there)."""
    folder = os.path.abspath(path)
    while not os.path.isdir(folder):
        folder = os.path.dirname(folder)
    vfs = os.statvfs(folder)
    return folder, vfs.f_bavail * vfs.f_frsize


def region_header(path: str):
    """The memascend region header at `path` (ssd.region.RegionHeader), or None for a path without a region (a swap
    directory, another file). A region that is corrupt is an error (the plan would otherwise use a wrong size)."""
    from memascend_cli.ssd import region

    if os.path.isdir(path) or (os.path.isfile(path) and os.path.getsize(path) < region.HEADER_BYTES):
        return None
    block = region.read_block(path, 0, region.HEADER_BYTES)
    return region.decode(block) if region.looks_like_region(block) else None


def apply_region(spec: HardwareSpec, path: str) -> HardwareSpec:
    """If `path` holds a memascend region (region_header), its data area is the SSD space and its probe the
    bandwidth; a path without a region keeps the file system's free space."""
    header = region_header(path)
    if header is None:
        return spec
    probe_result = header.probe
    return dataclasses.replace(
        spec,
        nvme_free_gib=round((header.capacity_bytes - header.data_start_bytes) / GiB, 3),
        nvme_read_gbps=probe_result.read_gbps if probe_result is not None else spec.nvme_read_gbps,
        nvme_write_gbps=probe_result.write_gbps if probe_result is not None else spec.nvme_write_gbps,
        source=spec.source + f"+region {path}",
    )
