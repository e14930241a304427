"""The streaming safetensors writer: planned shards that safetensors and transformers read back."""

from __future__ import annotations

import json

import numpy as np
import pytest

from memascend_engine.export import ExportError, ShardedSafetensorsWriter, fp32_to

safetensors_numpy = pytest.importorskip("safetensors.numpy")


def tensors():
    rng = np.random.default_rng(0)
    return [("model.embed_tokens.weight", rng.standard_normal((64, 16), dtype=np.float32)),
            ("model.layers.0.mlp.up_proj.weight", rng.standard_normal((32, 16), dtype=np.float32)),
            ("model.norm.weight", rng.standard_normal((16,), dtype=np.float32))]


def test_one_file_when_it_fits(tmp_path):
    w = ShardedSafetensorsWriter(str(tmp_path), [(n, a.shape, "float32") for n, a in tensors()])
    for n, a in tensors():
        w.write(n, a)
    w.close()
    back = safetensors_numpy.load_file(str(tmp_path / "model.safetensors"))
    assert all(np.array_equal(back[n], a) for n, a in tensors())


def test_shards_and_index(tmp_path):
    entries = [(n, a.shape, "float32") for n, a in tensors()]
    w = ShardedSafetensorsWriter(str(tmp_path), entries, shard_bytes=3000)  # the 4096 B embedding alone, then the rest
    assert w.names == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    for n, a in tensors():
        w.write(n, a)
    w.close()
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(a.nbytes for _, a in tensors())
    for n, a in tensors():
        assert np.array_equal(safetensors_numpy.load_file(str(tmp_path / index["weight_map"][n]))[n], a)


def test_order_and_size_are_checked(tmp_path):
    w = ShardedSafetensorsWriter(str(tmp_path), [(n, a.shape, "float32") for n, a in tensors()])
    with pytest.raises(ExportError, match="expected model.embed_tokens.weight"):
        w.write("model.norm.weight", tensors()[2][1])
    with pytest.raises(ExportError, match="expected shape"):
        w.write("model.embed_tokens.weight", np.zeros(3, dtype=np.float32))


def test_fp32_to_bf16_and_fp16_round_like_torch():
    torch = pytest.importorskip("torch")
    a = np.concatenate([np.random.default_rng(1).standard_normal(10000).astype(np.float32) * 1e3,
                        np.array([0.0, -0.0, np.inf, -np.inf, 1e-40, 3.3895314e38], dtype=np.float32)])
    t = torch.from_numpy(a)
    assert np.array_equal(fp32_to(a, "bfloat16"), t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))
    assert np.array_equal(fp32_to(a, "float16"), t.to(torch.float16).numpy())
    assert fp32_to(np.array([np.nan], dtype=np.float32), "bfloat16")[0] == 0x7FC0
