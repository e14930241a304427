"""memascend_engine.ds_internals.swapper.OverflowBuffers: the adaptive parameter pool's overflow buffers are kept and
reused (best fit) instead of allocated, registered and freed on every fetch."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

from memascend_engine.ds_internals.context import PluginContext
from memascend_engine.ds_internals.swapper import OverflowBuffers
from memascend_engine.pinned import PinnedAllocator


def _pool():
    alloc = PinnedAllocator(lock=False, cuda_register=False)
    ctx = PluginContext(fused_overflow=False, malloc_trim=False, adam_in_place=False, pool_plan_factory=None)
    return OverflowBuffers(lambda n: alloc.empty(n, torch.float16), ctx.counters), alloc, ctx.counters


def test_released_buffers_are_reused_best_fit():
    pool, alloc, c = _pool()
    a, b = pool.take(1000), pool.take(5000)
    assert a.numel() == 1000 and b.numel() == 5000 and c["pool_overflow_allocations"] == 2
    assert c["pool_overflow_bytes"] == 2 * 6000
    pool.give_back(b)
    pool.give_back(a)
    small = pool.take(800)  # the smallest free buffer that holds it: a
    assert small is a and c["pool_overflow_reuses"] == 1
    big = pool.take(4000)
    assert big is b and c["pool_overflow_allocations"] == 2 and pool.free_count == 0
    third = pool.take(6000)  # nothing free is large enough: a new buffer
    assert third.numel() == 6000 and c["pool_overflow_allocations"] == 3
    for t in (small, big, third):
        pool.give_back(t)
    # A steady state of fetch/release cycles allocates nothing more and keeps every buffer alive.
    for _ in range(50):
        t = pool.take(900)
        pool.give_back(t)
    assert c["pool_overflow_allocations"] == 3 and c["pool_overflow_reuses"] == 52
    gc.collect()
    assert alloc.snapshot()["live_buffers"] == 3


def test_give_back_accepts_only_what_take_handed_out():
    pool, _, _ = _pool()
    t = pool.take(10)
    pool.give_back(t)
    with pytest.raises(KeyError):
        pool.give_back(t)  # twice
    with pytest.raises(KeyError):
        pool.give_back(torch.empty(10, dtype=torch.float16))
