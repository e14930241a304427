"""Python face of the native core (``csrc/``, built into ``memascend_engine._native``).

Importing this module never fails: the extension is loaded on first use, and
:func:`available` says whether it could be (and why not). torch is imported lazily, only by
:func:`as_tensor` and :func:`has_nonfinite_tensor`.

Names re-exported from the extension (resolved on first attribute access):

* ``IOEngine(path, *, writable=True, backend="auto", queue_depth=32, num_workers=4, block_size=1 << 20,
  max_io_bytes=0)``
  -- asynchronous O_DIRECT engine (io_uring via raw syscalls, or a pread/pwrite thread pool).
* ``AlignedBuffer(nbytes, *, lock=True, cuda_register=False, zero=True, huge_pages=True)`` -- exact-size,
  page-aligned host memory (2 MiB-aligned + MADV_HUGEPAGE from 2 MiB up); buffer protocol.
* ``IOError`` (OSError subclass), ``ShortTransferError`` (IOError subclass), ``AlignmentError``
  (ValueError subclass).
* ``dio_alignment(path) -> int``, ``dio_alignment_info(path) -> dict``, ``cuda_runtime_status() -> str``,
  ``cuda_close_syncs() -> int`` (closes of CUDA-registered buffers that first synchronised their
  device, so no in-flight copy outlives the mapping), ``page_size() -> int``.
* ``crc32c(data, crc=0)``, ``crc32c_at(address, nbytes, crc=0)``, ``crc32c_chunks(segments, chunk_bytes) -> bytes``
  (packed little-endian uint32 per chunk), ``crc32c_backend() -> "sse4.2" | "portable"``.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_EXTENSION = "memascend_engine._native"
_NATIVE_NAMES = frozenset(
    {
        "IOEngine",
        "AlignedBuffer",
        "IOError",
        "ShortTransferError",
        "AlignmentError",
        "dio_alignment",
        "dio_alignment_info",
        "cuda_runtime_status",
        "cuda_close_syncs",
        "page_size",
        "crc32c",
        "crc32c_at",
        "crc32c_chunks",
        "crc32c_backend",
    }
)
SCAN_DTYPES = ("float16", "bfloat16", "float32")

_module: ModuleType | None = None
_import_error: str | None = None


def _load() -> ModuleType | None:
    global _module, _import_error
    if _module is None and _import_error is None:
        try:
            _module = importlib.import_module(_EXTENSION)
        except ImportError as exc:
            _import_error = (
                f"{_EXTENSION} is not importable ({exc}); build it with `pip install -e .` "
                "(needs a C++17 compiler and pybind11; no torch or CUDA)"
            )
    return _module


def _require() -> ModuleType:
    mod = _load()
    if mod is None:
        raise ImportError(_import_error)
    return mod


def available() -> tuple[bool, str]:
    """(True, where it was loaded from) or (False, why the extension cannot be used)."""
    mod = _load()
    if mod is None:
        return False, str(_import_error)
    return True, f"{_EXTENSION} loaded from {mod.__file__}"


def __getattr__(name: str) -> Any:
    if name in _NATIVE_NAMES:
        value = getattr(_require(), name)
        globals()[name] = value  # later lookups skip __getattr__
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _NATIVE_NAMES)


def _scan_dtype_name(dtype: Any) -> str:
    # torch.float16 -> "torch.float16", numpy.dtype("float16") -> "float16"; the extension strips "torch.".
    name = dtype if isinstance(dtype, str) else str(dtype)
    return name


def has_nonfinite(address: int, numel: int, dtype: Any, num_threads: int = 0) -> bool:
    """True if any of ``numel`` elements at ``address`` is +-inf or nan.

    ``dtype``: "float16", "bfloat16", "float32" (aliases half/fp16/bf16/float/fp32, or a torch/numpy
    dtype). One multi-threaded pass over the raw bits, no allocation proportional to ``numel``, GIL
    released. ``num_threads=0`` uses every core.
    """
    return bool(_require().has_nonfinite(int(address), int(numel), _scan_dtype_name(dtype), int(num_threads)))


def has_nonfinite_tensor(t: Any, num_threads: int = 0) -> bool:
    """:func:`has_nonfinite` for a contiguous CPU torch tensor (float16, bfloat16 or float32)."""
    if t.device.type != "cpu":
        raise ValueError(f"has_nonfinite_tensor needs a CPU tensor, got device {t.device}")
    if not t.is_contiguous():
        # A silent .contiguous() would allocate a full copy, which is what this scan exists to avoid.
        raise ValueError("has_nonfinite_tensor needs a contiguous tensor (call .contiguous() explicitly)")
    name = str(t.dtype).removeprefix("torch.")
    if name not in SCAN_DTYPES:
        raise ValueError(f"has_nonfinite_tensor supports {SCAN_DTYPES}, got {t.dtype}")
    return has_nonfinite(t.data_ptr(), t.numel(), name, num_threads)


def as_tensor(buf: Any, dtype: Any, shape: int | tuple[int, ...] | list[int] | None = None) -> Any:
    """A torch tensor over ``buf``'s memory (no copy).

    ``buf`` is an :class:`AlignedBuffer` (or anything exporting a writable buffer). ``dtype`` is a
    torch dtype or its name. ``shape=None`` covers the whole buffer (nbytes // itemsize elements);
    otherwise the first prod(shape) elements. The tensor holds a memoryview of ``buf``: the buffer
    stays alive as long as the tensor does, and ``buf.close()`` raises BufferError meanwhile.
    """
    import torch

    dt = getattr(torch, dtype.removeprefix("torch.")) if isinstance(dtype, str) else dtype
    if not isinstance(dt, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype or its name, got {dtype!r}")
    itemsize = torch.empty((), dtype=dt).element_size()
    view = memoryview(buf)
    nbytes = view.nbytes
    if shape is None:
        dims: tuple[int, ...] = (nbytes // itemsize,)
    else:
        dims = (int(shape),) if isinstance(shape, int) else tuple(int(d) for d in shape)
    count = math.prod(dims)
    if count * itemsize > nbytes:
        raise ValueError(f"shape {dims} of {dt} needs {count * itemsize} bytes; the buffer has {nbytes}")
    if count == 0:
        raise ValueError("as_tensor needs at least one element (torch.frombuffer cannot make an empty view)")
    # frombuffer keeps a reference to `view` (released with the tensor's storage), and `view` holds
    # a buffer export on `buf`.
    t = torch.frombuffer(view, dtype=dt, count=count)
    return t.view(dims)


def bf16_narrow_sr_tensor(t: Any, n: int, seed: int, start: int = 0) -> None:
    """In place: the first n elements of the contiguous fp32 CPU tensor `t` become bf16 values in its first 2n bytes,
    rounded stochastically under `seed` (csrc/moments.h); `start`: elements [start, start + n) only, element i's bf16
    at byte 2i (ascending blocks of one buffer, each once)."""
    _check_fp32(t, start + n)
    _require().bf16_narrow_sr(t.data_ptr(), int(n), int(seed) & 0xFFFFFFFF, int(start))


def bf16_widen_tensor(t: Any, n: int, upper_byte: int, start: int = 0) -> None:
    """In place: the n bf16 values at byte `upper_byte` (>= 2n) of the contiguous fp32 CPU tensor `t` become its first
    n elements (csrc/moments.h); `start`: elements [start, start + n) only (bf16 i at upper_byte + 2i)."""
    _check_fp32(t, start + n)
    if upper_byte + 2 * (start + n) > t.numel() * 4:
        raise ValueError(f"bf16_widen_tensor: {n} bf16 values at byte {upper_byte} run past the tensor")
    if upper_byte < 2 * (start + n):
        raise ValueError("bf16_widen_tensor: the bf16 values must start at byte 2 x (start + n) or later")
    _require().bf16_widen(t.data_ptr() + 4 * start, int(n), int(upper_byte) - 2 * start)


def master_split_tensor(master: Any, residual: Any, n: int, start: int = 0) -> Any:
    """The int16 residuals (into `residual`, contiguous int16) of the first n elements of the contiguous fp32 CPU tensor
    `master` beside their bf16 round to nearest even; returns the int64 indices of those a residual cannot hold (a tie
    rounded down, a NaN: csrc/moments.h). `start`: elements [start, start + n) only (indices still from 0)."""
    import torch

    _check_fp32(master, start + n)
    if residual.dtype != torch.int16 or not residual.is_contiguous() or residual.numel() < start + n:
        raise ValueError(f"master_split_tensor: residual must be {start + n} contiguous int16 elements")
    cap = 64
    while True:
        found = torch.empty(cap, dtype=torch.int64)
        count = _require().master_split(master.data_ptr() + 4 * start, residual.data_ptr() + 2 * start, int(n),
                                         found.data_ptr(), cap)
        if count <= cap:
            return found[:count] + start if count and start else found[:count]
        cap = count


def master_join_tensor(t: Any, residual: Any, n: int, upper_byte: int, start: int = 0) -> None:
    """In place: the n bf16 values at byte `upper_byte` (>= 2n) of the contiguous fp32 CPU tensor `t` and the n int16
    `residual`s become its first n elements (csrc/moments.h); `start`: elements [start, start + n) only."""
    import torch

    _check_fp32(t, start + n)
    if upper_byte + 2 * (start + n) > t.numel() * 4:
        raise ValueError(f"master_join_tensor: {n} bf16 values at byte {upper_byte} run past the tensor")
    if upper_byte < 2 * (start + n):
        raise ValueError("master_join_tensor: the bf16 values must start at byte 2 x (start + n) or later")
    if residual.dtype != torch.int16 or not residual.is_contiguous() or residual.numel() < start + n:
        raise ValueError(f"master_join_tensor: residual must be {start + n} contiguous int16 elements")
    _require().master_join(t.data_ptr() + 4 * start, residual.data_ptr() + 2 * start, int(n),
                           int(upper_byte) - 2 * start)


WIDEN_MOMENTS, JOIN_MASTER, SPLIT_MASTER, NARROW_MOMENTS = 1, 2, 4, 8
"""adam_step_fused_tensors' flags (csrc/moments.h kWidenMoments ...)."""


def adam_step_fused_tensors(master: Any, residual: Any, exp_avg: Any, exp_avg_sq: Any, grad: Any, n: int,
                            upper_byte: int, flags: int, fixes: tuple | None, adam: tuple, seeds: Sequence[int]) -> Any:
    """One chunk's first n elements stepped in one pass (csrc/moments.h adam_step_fused) on contiguous fp32 CPU
    tensors, in place: `fixes` (ascending int64 indices, fp32 masters) patch the joined master; `adam`: (the nine fp32
    constants of DeepSpeed's CPU Adam for the call, decoupled weight decay); `seeds`: exp_avg's and exp_avg_sq's
    rounding. Returns the int64 indices of the masters the residual cannot hold."""
    import torch

    for t in (master, exp_avg, exp_avg_sq, grad):
        _check_fp32(t, n)
    if flags & (JOIN_MASTER | SPLIT_MASTER) and (residual is None or residual.dtype != torch.int16
                                                 or not residual.is_contiguous() or residual.numel() < n):
        raise ValueError(f"adam_step_fused_tensors: residual must be {n} contiguous int16 elements")
    # The bf16 values sit at upper_byte of the buffers they widen into: the moments (WIDEN_MOMENTS), the master
    # (JOIN_MASTER); a buffer neither reads them from may be just the chunk (a held chunk's moments, dram_tier.in_dram).
    holders = ([exp_avg, exp_avg_sq] if flags & WIDEN_MOMENTS else []) + ([master] if flags & JOIN_MASTER else [])
    if holders and (upper_byte < 2 * n or upper_byte + 2 * n > 4 * min(t.numel() for t in holders)):
        raise ValueError(f"adam_step_fused_tensors: {n} bf16 values at byte {upper_byte} do not fit")
    idx, values = fixes if fixes is not None else (None, None)
    constants, adamw = adam
    cap = 64
    found = torch.empty(cap, dtype=torch.int64)
    count = _require().adam_step_fused(
        master.data_ptr(), 0 if residual is None else residual.data_ptr(), exp_avg.data_ptr(), exp_avg_sq.data_ptr(),
        grad.data_ptr(), int(n), int(upper_byte), int(flags), 0 if idx is None else idx.data_ptr(),
        0 if values is None else values.data_ptr(), 0 if idx is None else idx.numel(), list(constants), bool(adamw),
        int(seeds[0]) & 0xFFFFFFFF, int(seeds[1]) & 0xFFFFFFFF, found.data_ptr(), cap)
    if count > cap:  # more than room for: the split again from the stepped masters (the same residuals) lists all
        return master_split_tensor(master, residual, n)
    return found[:count]


def _check_fp32(t: Any, n: int) -> None:
    if t.device.type != "cpu" or not t.is_contiguous() or str(t.dtype) != "torch.float32":
        raise ValueError(f"needs a contiguous fp32 CPU tensor, got {t.dtype} on {t.device}")
    if not 0 <= n <= t.numel():
        raise ValueError(f"{n} elements of a tensor of {t.numel()}")
