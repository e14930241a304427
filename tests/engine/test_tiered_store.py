"""The DRAM tier's store (engine/dram_tier.py TieredStore) on a real region: held keys live in DRAM and move no
region byte, keys written before the tier moved in, held bytes computed in place, the overlap's exchange across DRAM and
region, refusal."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_engine_direct_nvme import make_region

MiB = 2**20


@pytest.fixture
def store(tmp_path):
    from memascend_engine.dram_tier import TieredStore

    s = TieredStore(make_region(tmp_path), 0, tier_bytes=64 * MiB)
    yield s
    s.close()


def _write(store, key: str, values: torch.Tensor, offset: int = 0) -> None:
    store.complete(store.submit("w", values.data_ptr(), values.numel() * 4, key, offset))


def _read(store, key: str, numel: int, offset: int = 0) -> torch.Tensor:
    from memascend_engine.pinned import PinnedAllocator

    out = PinnedAllocator(lock=False).empty(numel, torch.float32)
    store.complete(store.submit("r", out.data_ptr(), numel * 4, key, offset))
    return out


def _vals(numel: int, start: float) -> torch.Tensor:
    from memascend_engine.pinned import PinnedAllocator

    t = PinnedAllocator(lock=False).empty(numel, torch.float32)
    return t.copy_(torch.arange(numel, dtype=torch.float32) + start)


def test_held_keys_live_in_dram_and_move_no_region_byte(store):
    store.hold(["a"])
    _write(store, "a", _vals(MiB, 0))
    _write(store, "a", _vals(1024, 7), offset=4096)  # a piece rewritten in place
    want = torch.arange(MiB, dtype=torch.float32)
    want[1024:2048] = torch.arange(1024, dtype=torch.float32) + 7
    assert torch.equal(_read(store, "a", MiB), want)
    _write(store, "b", _vals(MiB, 0))  # not held: the region
    s = store.snapshot()
    assert s["bytes_written"] == 4 * MiB and s["bytes_read"] == 0
    t = s["dram_tier"]
    assert t["keys"] == 1 and t["bytes_written"] == 4 * MiB + 4096 and t["bytes_read"] == 4 * MiB
    assert store.written_bytes("a") == 4 * MiB and store.is_resident("a") and not store.is_resident("b")
    from memascend_engine.direct_nvme import RegionDataError

    with pytest.raises(RegionDataError, match="DRAM-tier key a"):
        _read(store, "a", MiB + 1)


def test_held_bytes_are_computed_in_place_and_counted_not_copied(store):
    from memascend_engine.dram_tier import in_dram

    store.hold(["m"])
    assert in_dram(store, "m", 0, MiB, torch.float32) is None  # nothing written yet to read
    m = in_dram(store, "m", 0, MiB, torch.float32, write=True)  # where a write of it goes: admitted
    m.copy_(torch.arange(MiB, dtype=torch.float32)).mul_(2)  # computed where it lives
    _write(store, "m", m)  # the write-back at its own address moves nothing
    assert torch.equal(_read(store, "m", MiB), 2 * torch.arange(MiB, dtype=torch.float32))
    piece = in_dram(store, "m", 4096, 1024, torch.float32)
    assert piece.data_ptr() == m.data_ptr() + 4096 and float(piece[0]) == 2048.0
    store.complete(store.submit("r", piece.data_ptr(), 4096, "m", 4096))
    t = store.snapshot()["dram_tier"]
    assert t["in_place_bytes"] == 4 * MiB + 4096 and t["bytes_written"] == 4 * MiB and t["bytes_read"] == 4 * MiB + 4096
    _write(store, "r", _vals(1024, 0))  # not held: on the region, no tensor of it
    assert in_dram(store, "r", 0, 1024, torch.float32) is None and in_dram(store, "r", 0, 16, torch.float32,
                                                                           write=True) is None


def test_sized_keys_get_their_buffer_when_held_and_the_first_write_lands_in_it(store):
    from memascend_engine.dram_tier import in_dram

    store.hold(["g", "n"], sizes={"g": 4 * MiB, "x": MiB})  # "n": no size (admitted by its first write); "x": not held
    t = store.snapshot()["dram_tier"]
    assert t["keys"] == 1 and t["resident_bytes"] == 4 * MiB  # taken (locked, so faulted in) before any write
    assert store.is_resident("g") and not store.is_resident("n") and not store.is_resident("x")
    assert store.written_bytes("g") == 0 and in_dram(store, "g", 0, MiB, torch.float32) is None  # nothing to read yet
    address = in_dram(store, "g", 0, MiB, torch.float32, write=True).data_ptr()
    _write(store, "g", _vals(MiB, 1))
    assert torch.equal(_read(store, "g", MiB), torch.arange(MiB, dtype=torch.float32) + 1)
    assert in_dram(store, "g", 0, MiB, torch.float32).data_ptr() == address  # the same buffer: not grown
    assert store.snapshot()["dram_tier"]["resident_bytes"] == 4 * MiB and store.snapshot()["bytes_written"] == 0


def test_keys_written_before_the_tier_move_in_once(store):
    _write(store, "p", _vals(MiB, 3))
    store.declare_zero("z", 4096)
    store.hold(["p", "z"])
    assert store.is_resident("p") and store.is_resident("z")
    assert torch.equal(_read(store, "p", MiB), torch.arange(MiB, dtype=torch.float32) + 3)
    assert torch.equal(_read(store, "z", 1024), torch.zeros(1024))
    s = store.snapshot()
    assert s["dram_tier"]["promoted_bytes"] == 4 * MiB + 4096 and s["bytes_read"] == 4 * MiB  # read once, to move
    assert s["extent_bytes"] == 0  # the region's extents are free


def test_exchange_in_dram_and_across_dram_and_region(store):
    store.hold(["k", "k~next"])
    _write(store, "k", _vals(1024, 0))
    _write(store, "k~next", _vals(1024, 100))
    store.exchange("k", "k~next")
    assert torch.equal(_read(store, "k", 1024), torch.arange(1024, dtype=torch.float32) + 100)
    assert torch.equal(_read(store, "k~next", 1024), torch.arange(1024, dtype=torch.float32))
    assert store.snapshot()["bytes_written"] == 0
    # One held, one not (the tier refused its partner): the held one goes to the region, then the extents swap.
    store.hold(["m"])
    _write(store, "m", _vals(1024, 5))
    _write(store, "m~next", _vals(1024, 50))
    store.exchange("m", "m~next")
    assert torch.equal(_read(store, "m", 1024), torch.arange(1024, dtype=torch.float32) + 50)
    assert torch.equal(_read(store, "m~next", 1024), torch.arange(1024, dtype=torch.float32) + 5)
    assert not store.is_resident("m") and not store.is_resident("m~next")


def test_forget_and_refuse(store):
    store.hold(["a", "b"])
    _write(store, "a", _vals(1024, 0))
    store.forget("a")
    assert store.snapshot()["dram_tier"]["resident_bytes"] == 0 and store.written_bytes("a") == 0
    store.refuse("no room")
    store.refuse("said once")
    _write(store, "b", _vals(1024, 0))  # held, but the tier admits nothing more: the region
    s = store.snapshot()
    assert not store.is_resident("b") and s["bytes_written"] == 4096 and s["dram_tier"]["fallback"] == "no room"
