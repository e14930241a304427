"""The `"auto"` values of Hugging Face-style DeepSpeed configs (memascend_engine.trainer_config; torch-free)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from memascend_engine import trainer_config as tc

ASSETS = Path(__file__).resolve().parents[1] / "assets" / "hf"


def hf_docs_config() -> dict:
    # The ZeRO-3 NVMe example of the Hugging Face DeepSpeed integration docs (transformers main_classes/deepspeed).
    return json.loads((ASSETS / "ds_zero3_nvme_auto.json").read_text())


def test_auto_paths_lists_every_auto_value():
    paths = tc.auto_paths(hf_docs_config())
    assert "optimizer.params.lr" in paths and "train_micro_batch_size_per_gpu" in paths
    assert tc.zero_auto_paths(hf_docs_config()) == [f"zero_optimization.{k}" for k in tc.HIDDEN_SIZE_KEYS]


def test_resolve_fills_what_the_hf_trainer_fills():
    cfg = hf_docs_config()
    changes = tc.resolve_zero_auto(cfg, 576)
    zo = cfg["zero_optimization"]
    # transformers/integrations/deepspeed.py trainer_config_finalize: h*h, int(0.9*h*h), 10*h under ZeRO-3.
    assert (zo["reduce_bucket_size"], zo["stage3_prefetch_bucket_size"], zo["stage3_param_persistence_threshold"]) \
        == (576 * 576, int(0.9 * 576 * 576), 5760)
    assert changes["zero_optimization.reduce_bucket_size"] == {"from": "auto", "to": 331776}
    assert tc.zero_auto_paths(cfg) == []
    # The trainer's own "auto" values are left to it.
    assert cfg["optimizer"]["params"]["lr"] == "auto"


def test_resolve_below_zero3_fills_only_the_reduce_bucket():
    cfg = {"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}
    assert tc.resolve_zero_auto(cfg, 64) == {"zero_optimization.reduce_bucket_size": {"from": "auto", "to": 4096}}


def test_resolve_without_hidden_size_says_which_keys():
    with pytest.raises(ValueError, match="reduce_bucket_size.*hidden size is unknown"):
        tc.resolve_zero_auto(hf_docs_config(), None)


def test_auto_nobody_fills_is_refused_with_its_name():
    cfg = hf_docs_config()
    cfg["zero_optimization"]["sub_group_size"] = "auto"
    with pytest.raises(ValueError, match="zero_optimization.sub_group_size; give a number"):
        tc.check_zero_auto(cfg)


def test_resolved_config_reads_back_as_zero_settings():
    # The crash the HF-docs config gave install(): 'could not convert string to float: auto'.
    from memascend_cli.planner import zero

    cfg = hf_docs_config()
    with pytest.raises(ValueError):
        zero.from_ds_config(cfg)
    tc.resolve_zero_auto(cfg, 512)
    assert zero.from_ds_config(cfg).reduce_bucket_size == 512 * 512


def test_move_offload_to_nvme_keeps_other_keys():
    cfg = json.loads((ASSETS / "llamafactory_ds_z3_offload_config.json").read_text())
    before = copy.deepcopy(cfg)
    assert tc.offload_devices(cfg) == {"offload_param": "cpu", "offload_optimizer": "cpu"}
    changes = tc.move_offload_to_nvme(cfg)
    assert changes == {"offload_param.device": {"from": "cpu", "to": "nvme"},
                       "offload_optimizer.device": {"from": "cpu", "to": "nvme"}}
    assert cfg["zero_optimization"]["offload_param"] == {**before["zero_optimization"]["offload_param"],
                                                         "device": "nvme"}
    assert tc.move_offload_to_nvme({"zero_optimization": {"stage": 3}})["offload_param.device"]["from"] == "none"


def test_setting_names_match_the_planner():
    from memascend_cli.planner import zero

    assert tc.setting_names(tc.HIDDEN_SIZE_KEYS) <= set(zero.ZeroSettings.__dataclass_fields__)


class _Cfg:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def test_model_hidden_size_follows_hf_order():
    assert tc.model_hidden_size(_Cfg(config=_Cfg(hidden_size=64))) == 64
    assert tc.model_hidden_size(_Cfg(config=_Cfg(hidden_sizes=[8, 32]))) == 32
    assert tc.model_hidden_size(_Cfg(config=_Cfg(text_config=_Cfg(hidden_size=16)))) == 16
    assert tc.model_hidden_size(object()) is None


def test_initialize_config_takes_the_dict_keyword():
    cfg = {"a": 1}
    assert tc.initialize_config({"config_params": cfg}) is cfg
    assert tc.initialize_config({"config": cfg}) is cfg
    assert tc.initialize_config({"config": "ds.json"}) is None

