"""bf16 Adam moments (csrc/moments.h): in-place fp32 -> bf16 with stochastic rounding, and bf16 -> fp32 widening,
against a numpy reference of the same rounding, and the rounding's statistics."""

from __future__ import annotations

import os

import pytest
from memascend_engine import native

OK, WHY = native.available()
if not OK and os.environ.get("MEMASCEND_REQUIRE_NATIVE") == "1":
    raise RuntimeError(WHY)
pytestmark = pytest.mark.skipif(not OK, reason=f"native extension unavailable: {WHY}")
torch = pytest.importorskip("torch", reason="the conversions work on torch tensors")
np = pytest.importorskip("numpy", reason="the reference rounding is written in numpy")

SIZES = [1, 2, 4095, 4096, 4097, 12289, 65537]


def _noise(n: int, seed: int) -> np.ndarray:
    """csrc/moments.cpp's sr_noise for indices 0..n-1, in numpy's wrapping uint32 arithmetic."""
    with np.errstate(over="ignore"):
        h = np.arange(n, dtype=np.uint32) * np.uint32(0x9E3779B1) ^ np.uint32(seed)
        h ^= h >> np.uint32(16)
        h *= np.uint32(0x85EBCA6B)
        h ^= h >> np.uint32(13)
        h *= np.uint32(0xC2B2AE35)
        h ^= h >> np.uint32(16)
    return h & np.uint32(0xFFFF)


def _reference(x: torch.Tensor, seed: int) -> torch.Tensor:
    bits = x.numpy().view(np.uint32)
    finite = (bits & np.uint32(0x7F800000)) != np.uint32(0x7F800000)
    with np.errstate(over="ignore"):
        out = ((bits + _noise(bits.size, seed) * finite.astype(np.uint32)) >> np.uint32(16)).astype(np.uint16)
    return torch.from_numpy(out.view(np.int16).copy()).view(torch.bfloat16)


def _narrowed(t: torch.Tensor, n: int) -> torch.Tensor:
    return t.view(torch.uint8)[:2 * n].view(torch.bfloat16).clone()


@pytest.mark.parametrize("n", SIZES)
def test_narrow_in_place_matches_the_reference_and_widen_restores_it(n):
    x = torch.randn(n + 3) * 1e-2
    x[:3] = torch.tensor([float("inf"), float("-inf"), float("nan")])
    t = torch.cat([x, torch.full((5,), 7.0)])  # capacity beyond n + 3: the tail is left alone
    native.bf16_narrow_sr_tensor(t, n + 3, 1234)
    q = _narrowed(t, n + 3)
    assert torch.equal(q.view(torch.int16), _reference(x, 1234).view(torch.int16))
    assert torch.isinf(q[:2]).all() and torch.isnan(q[2])
    assert torch.equal(t[-5:], torch.full((5,), 7.0))
    # Each value went to one of its two bf16 neighbours.
    lo = x[3:].to(torch.bfloat16).float()
    assert ((q[3:].float() - x[3:]).abs() <= lo.abs() * 2 ** -7 + 1e-38).all()
    # Widen from the upper half of a buffer of capacity cap: exact, in place.
    cap = n + 3 + 11
    u = torch.empty(cap)
    u.view(torch.uint8)[2 * cap:2 * cap + 2 * (n + 3)].view(torch.bfloat16).copy_(q)
    native.bf16_widen_tensor(u, n + 3, 2 * cap)
    assert torch.equal(u[:n + 3].view(torch.int32), q.float().view(torch.int32))


def test_values_exactly_representable_in_bf16_are_kept():
    v = torch.randn(10000).to(torch.bfloat16)
    t = v.float()
    native.bf16_narrow_sr_tensor(t, v.numel(), 5)
    assert torch.equal(_narrowed(t, v.numel()).view(torch.int16), v.view(torch.int16))


@pytest.mark.parametrize("share", [0.25, 0.45, 0.9])
def test_rounding_is_unbiased(share):
    # A value `share` of the way from 1 to the next bf16 value (1 + 2^-7) goes up that often, on average.
    x = torch.full((200_000,), 1.0 + share * 2 ** -7)
    native.bf16_narrow_sr_tensor(x, x.numel(), 99)
    up = (_narrowed(x, x.numel()).float() > 1).float().mean().item()
    assert up == pytest.approx(share, abs=0.005)


def test_a_slow_moving_average_keeps_moving():
    # exp_avg_sq with beta2 = 0.999 moves by 0.05% per step toward 1.5: below half a bf16 step, so nearest rounding
    # never leaves 1.0; stochastic rounding follows the fp32 average.
    v16 = torch.ones(20000)
    v32 = 1.0
    for step in range(500):
        v32 = 0.999 * v32 + 0.001 * 1.5
        a = 0.999 * v16 + 0.001 * 1.5
        native.bf16_narrow_sr_tensor(a, a.numel(), step)
        v16 = _narrowed(a, a.numel()).float()
    assert ((0.999 * torch.ones(1) + 0.0015).to(torch.bfloat16).float() == 1.0).all()
    assert v16.mean().item() == pytest.approx(v32, rel=1e-3)  # nearest rounding: 16% low (1.0)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        native.bf16_narrow_sr_tensor(torch.zeros(4, dtype=torch.float16), 4, 0)
    with pytest.raises(ValueError):
        native.bf16_narrow_sr_tensor(torch.zeros(4), 5, 0)
    with pytest.raises(ValueError):
        native.bf16_widen_tensor(torch.zeros(4), 4, 4)  # would run past the tensor
    with pytest.raises(ValueError):
        native.bf16_widen_tensor(torch.zeros(8), 4, 4)  # below byte 2n: the widening would overwrite its input


def test_bf16_moments_need_the_bounded_engine(tmp_path):
    pytest.importorskip("deepspeed")
    from memascend_engine import EngineOptions, install

    nvme = {"device": "nvme", "nvme_path": str(tmp_path)}
    cfg = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
           "zero_optimization": {"stage": 3, "offload_param": dict(nvme), "offload_optimizer": dict(nvme)}}
    with pytest.raises(ValueError, match="needs the bounded engine"):
        install(cfg, region=None, options=EngineOptions(optimizer_moments="bf16", streaming=False, direct_nvme=False))
    with pytest.raises(ValueError, match="use fp32 or bf16"):
        EngineOptions(optimizer_moments="fp8")
