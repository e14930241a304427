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
import os
import platform
import resource
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from memascend_cli.ssd.blockdev import (
    BlockDevice,
    list_block_devices,
)
from memascend_cli.errors import BadInput, PresetNotFound, did_you_mean
from memascend_cli.planner.spec import HardwareSpec
from memascend_cli.ssd.path import PathInfo, apply_region, free_space_at, libc, path_info
from memascend_cli.units import GiB, parse_bandwidth_gbps, parse_size

# io_uring_setup(2) by syscall number: Python 3.11 does not wrap it; it is 425 on every architecture (syscalls
# numbered from 424 up are shared).
_SYS_IO_URING_SETUP = 425
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
    fd = libc().syscall(ctypes.c_long(_SYS_IO_URING_SETUP), ctypes.c_uint(1), params)
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


