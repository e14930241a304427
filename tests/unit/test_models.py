import json

import pytest

from memascend_cli.errors import BadInput, PresetNotFound
from memascend_cli.models import list_model_presets, load_model, load_preset

# Published totals (model cards / safetensors metadata).
PUBLISHED = {
    "llama-3.1-8b": 8_030_261_248, "qwen2.5-7b": 7_615_616_512, "qwen2.5-14b": 14_770_033_664,
    "qwen2.5-32b": 32_763_876_352, "mistral-nemo-12b": 12_247_782_400, "smollm2-360m": 361_821_120,
    "qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304, "qwen2.5-72b": 72_706_203_648,
    "llama-3.2-1b": 1_235_814_400, "llama-3.2-3b": 3_212_749_824, "llama-3.1-70b": 70_553_706_496,
}


def test_required_presets_exist():
    assert set(PUBLISHED) <= set(list_model_presets())


@pytest.mark.parametrize("name", list_model_presets())
def test_every_preset_matches_its_published_count(name):
    spec = load_preset(name)
    if name in PUBLISHED:
        assert spec.num_params == PUBLISHED[name]
    if spec.published_num_params is not None:
        assert spec.num_params == spec.published_num_params
    assert spec.source


def test_inventory_details():
    q = load_preset("qwen2.5-7b")
    names = {t.name: t for t in q.tensors()}
    assert names["model.layers.0.self_attn.k_proj.weight"].shape == (512, 3584)  # GQA: 4 kv heads x 128
    assert "model.layers.0.self_attn.q_proj.bias" in names  # qwen2 qkv bias
    assert "model.layers.0.self_attn.o_proj.bias" not in names
    assert "lm_head.weight" in names
    tied = {t.name for t in load_preset("qwen2.5-0.5b").tensors()}
    assert "lm_head.weight" not in tied
    nemo = {t.name: t for t in load_preset("mistral-nemo-12b").tensors()}
    assert nemo["model.layers.0.self_attn.q_proj.weight"].shape == (4096, 5120)  # head_dim 128 != 5120/32
    assert load_preset("llama-3.1-8b").largest_tensor_numel == 525_336_576


def test_config_json_and_directory(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "tie_word_embeddings": True,
           "torch_dtype": "bfloat16", "architectures": ["LlamaForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    by_dir, by_file = load_model(str(tmp_path)), load_model(str(tmp_path / "config.json"))
    assert by_dir.num_params == by_file.num_params
    # embed 256*64 + 2 layers*(q 64*64 + k,v 32*64 each + o 64*64 + mlp 3*64*128 + 2*64) + norm 64
    assert by_dir.num_params == 256 * 64 + 2 * (4096 + 2 * 2048 + 4096 + 3 * 8192 + 128) + 64


@pytest.mark.parametrize("bad,fragment", [
    ("qwen2.5-7", "unknown model"), ("./no/such/dir", "no such"), ("/nonexistent/config.json", "no such file"),
])
def test_bad_model_names(bad, fragment):
    with pytest.raises(BadInput) as e:
        load_model(bad)
    assert fragment in e.value.message and e.value.hint


def test_typo_gets_a_suggestion():
    with pytest.raises(PresetNotFound) as e:
        load_model("qwen2.5-7bb")
    assert "qwen2.5-7b" in e.value.hint


def test_yaml_with_unknown_key_is_rejected(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text("model_type: llama\nhidden_size: 64\nintermediate_size: 128\nnum_hidden_layers: 1\n"
                 "num_attention_heads: 4\nnum_key_value_heads: 4\nvocab_size: 10\nhiden_size: 3\n")
    with pytest.raises(BadInput) as e:
        load_model(str(p))
    assert "hiden_size" in e.value.message and str(p) in e.value.message


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 512}))
    with pytest.raises(BadInput) as e:
        load_model(str(tmp_path))
    assert "not supported" in e.value.message


@pytest.mark.parametrize("name", ["tiny-llama", "qwen2.5-7b", "llama-3.1-8b", "qwen2.5-0.5b", "mistral-nemo-12b",
                                  "bench-llama-136m"])
def test_counts_match_transformers_on_meta_device(name):
    torch = pytest.importorskip("torch", reason="needs torch")
    pytest.importorskip("transformers", reason="needs transformers")
    from memascend_engine.hf_models import causal_lm_factory

    spec = load_preset(name)
    with torch.device("meta"):
        model = causal_lm_factory(spec)()
    hf = {n: tuple(p.shape) for n, p in model.named_parameters()}
    ours = {t.name: t.shape for t in spec.tensors()}
    assert hf == ours
    assert sum(p.numel() for p in model.parameters()) == spec.num_params


def test_gguf_header_gives_the_architecture(tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    from memascend_cli.models import load_gguf, load_model

    path = str(tmp_path / "m.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_context_length(256)
    w.add_token_list([f"t{i}" for i in range(100)])
    w.add_tensor("token_embd.weight", np.zeros((100, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    spec = load_gguf(path)
    assert (spec.model_type, spec.num_hidden_layers, spec.hidden_size, spec.intermediate_size) == ("llama", 2, 64, 128)
    assert (spec.num_attention_heads, spec.num_key_value_heads, spec.vocab_size) == (4, 2, 100)
    assert spec.tie_word_embeddings is True  # no output.weight tensor
    assert load_model(path) == spec


def test_package_file_reference(tmp_path):
    from memascend_cli.models import resolve_package_file

    assert resolve_package_file("package:memascend_presets/models/tiny-llama.yaml").endswith("tiny-llama.yaml")
    with pytest.raises(BadInput, match="not installed"):
        resolve_package_file("package:no_such_pkg_xyz/x.gguf")


@pytest.mark.parametrize("name", ["tiny-llama", "qwen2.5-0.5b", "bench-llama-136m"])
def test_the_engine_reads_a_models_inventory_from_its_transformers_config(name):
    """install() without a model_spec sizes the parameter pool from the model deepspeed.initialize receives: its
    config gives the spec when it describes exactly the module's parameters; anything else gives None."""
    torch = pytest.importorskip("torch", reason="needs torch")
    pytest.importorskip("transformers", reason="needs transformers")
    from memascend_engine.hf_models import causal_lm_factory
    from memascend_engine.runtime import inventory_spec

    spec = load_preset(name)
    with torch.device("meta"):
        model = causal_lm_factory(spec)()
        assert [(t.name, t.numel) for t in inventory_spec(model).tensors()] == \
            [(t.name, t.numel) for t in spec.tensors()]
        model.model.layers[0].mlp.extra = torch.nn.Parameter(torch.empty(3))  # e.g. an adapter's weight
        assert inventory_spec(model) is None
    assert inventory_spec(torch.nn.Linear(2, 2)) is None  # no transformers config


def test_without_any_inventory_the_pool_is_deepspeeds_shape_sized_to_the_largest_partition():
    from memascend_engine.options import EngineOptions
    from memascend_engine.runtime import Installed

    from memascend_cli.planner import zero

    cfg = {"zero_optimization": {"offload_param": {"device": "nvme", "buffer_count": 5, "buffer_size": 1e8}}}
    inst = Installed(options=EngineOptions(), ds_config=cfg, spec=None, rank=0, region=None)
    assert inst._param_plan(4, 16384, 1) is None  # deferred until the swapper knows the partitions
    assert inst._param_plan(4, 16384, 1, largest_partition_numel=524_288) == \
        zero.uniform_pool_plan(buffer_count=5, buffer_numel=524_288, elem_bytes=4)
    inst.inventory_spec = spec = load_preset("tiny-llama")
    assert inst._param_plan(4, 16384, 1) == zero.param_pool_plan(
        zero.model_partitions(spec, 1), elem_bytes=4, per_layer_counts=zero.per_layer_role_counts(spec),
        prefetch_layers=EngineOptions().prefetch_layers, min_aio_bytes=16384)
