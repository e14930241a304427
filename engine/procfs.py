"""Process helpers shared by the training worker, the parity script and the benchmark jobs (no torch): the one home of
the /proc/self/status and /proc/self/io readers."""

import ctypes
import functools
import os
import xml.etree.ElementTree as ET


def status_kib(field: str) -> int:
    """A /proc/self/status field in KiB (VmRSS, VmHWM, VmLck, ...); 0 when absent."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def dram_view():
    """The DRAM this process may use now (planner.offload_choice.DramView): MemAvailable, its own RSS and its
    cgroup's memory limit."""
    from memascend_cli.hardware import MEMINFO, parse_meminfo
    from memascend_cli.planner.offload_choice import DramView
    from memascend_cli.run.cgroup import own_memory_limit_bytes

    with open(MEMINFO) as f:
        available = parse_meminfo(f.read()).get("MemAvailable", 0)
    return DramView(mem_available_bytes=available, own_rss_bytes=status_kib("VmRSS") * 1024,
                    cgroup_limit_bytes=own_memory_limit_bytes())


def io_bytes() -> dict[str, int]:
    """read_bytes / write_bytes of /proc/self/io: bytes this process really moved to or from the block layer (O_DIRECT
    swap traffic included, page-cache hits not); zeros where the kernel has no I/O accounting (proc(5))."""
    out = {"read_bytes": 0, "write_bytes": 0}
    try:
        with open("/proc/self/io") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in out:
                    out[key] = int(value)
    except OSError:
        pass
    return out


def single_rank_defaults() -> None:
    """Environment of a one-process job started without a launcher (else DeepSpeed's init_distributed
    tries MPI discovery): rank 0 of 1 on the CPU accelerator, a port derived from the pid."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))


class _MallInfo2(ctypes.Structure):
    # glibc >= 2.33 struct mallinfo2 (malloc.h): all fields size_t.
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@functools.cache
def _mallinfo2():
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn


def malloc_state() -> dict | None:
    """glibc's view of this process's heap (mallinfo2, summed over all arenas): bytes the arenas hold from the
    OS, bytes in use, bytes freed but kept (what a later malloc_trim could return) and bytes in mmapped chunks.
    None where the C library has no mallinfo2 (musl, glibc < 2.33)."""
    fn = _mallinfo2()
    if fn is None:
        return None
    m = fn()
    out = {"arena_bytes": m.arena, "in_use_bytes": m.uordblks, "free_kept_bytes": m.fordblks,
           "mmapped_bytes": m.hblkhd, "mmapped_chunks": m.hblks}
    arenas = malloc_arenas()
    if arenas is not None:
        out["arenas"] = arenas
    return out


@functools.cache
def _libc():
    libc = ctypes.CDLL("libc.so.6")
    for name in ("open_memstream", "malloc_info", "fclose", "free"):
        if not hasattr(libc, name):
            return None
    libc.open_memstream.restype = ctypes.c_void_p
    libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.free.argtypes = [ctypes.c_void_p]
    return libc


def parse_malloc_info(xml: str) -> list[list[int]]:
    """[[bytes the arena holds from the OS, of them free in its bins], ...] per arena (main arena first) from
    glibc's malloc_info(3) XML: each <heap> has <system type="current"> and <total type="fast"|"rest"> sizes
    (the arena's top chunk is in neither; mallinfo2's fordblks counts it)."""
    arenas = []
    for heap in ET.fromstring(xml).iter("heap"):
        system = sum(int(e.get("size", 0)) for e in heap.findall("system") if e.get("type") == "current")
        free = sum(int(e.get("size", 0)) for e in heap.findall("total") if e.get("type") in ("fast", "rest"))
        arenas.append([system, free])
    return arenas


def malloc_arenas() -> list[list[int]] | None:
    """Per-arena heap state (parse_malloc_info) of this process: glibc gives each thread that allocates under
    contention its own arena (up to 8 x cores), and what a thread's arena keeps free no other thread reuses. None
    where the C library has no malloc_info."""
    try:
        libc = _libc()
    except OSError:
        return None
    if libc is None:
        return None
    buf, size = ctypes.c_void_p(), ctypes.c_size_t()
    stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    if not stream:
        return None
    try:
        libc.malloc_info(0, stream)
    finally:
        libc.fclose(stream)
    try:
        return parse_malloc_info(ctypes.string_at(buf, size.value).decode())
    finally:
        libc.free(buf)
