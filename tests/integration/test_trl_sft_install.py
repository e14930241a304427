"""A plain TRL SFTTrainer script with `memascend_engine.install()` (trl_sft_job.py, one CPU process, the HF docs'
ZeRO-3 NVMe config with "auto" values): the engine must engage (bytes through the region, no swap files under
nvme_path) with install() after SFTConfig (the Trainer's own copy rewritten) and before it (`long`: the same path
test_hf_trainer_install.py covers for the HF Trainer, whose SFTTrainer subclass this is)."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from tests.integration.test_hf_trainer_install import ASSETS, HERE, run_job  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("order", [pytest.param("before", marks=pytest.mark.long), "after"])
def test_trl_sft_with_the_hf_docs_nvme_config(tmp_path, order):
    r, err = run_job(tmp_path, order, "ds_zero3_nvme_auto.json", script=HERE / "trl_sft_job.py")
    s = r["stats"]
    assert len(r["losses"]) == 2 and all(x == x and x > 0 for x in r["losses"])  # finite, from TRL's own logging
    assert s["bytes_read"] > 0 and s["bytes_written"] > 0
    assert r["files"] == [] and s["swap_files_created"] == 0
    zo = r["trainer_config"]["zero_optimization"]
    # memascend's knobs reached the config SFTTrainer gave DeepSpeed, and the Trainer filled its "auto" keys.
    assert zo["offload_param"]["max_in_cpu"] == 0 and zo["stage3_max_reuse_distance"] == 0
    assert zo["reduce_bucket_size"] == 512 * 512
    assert "could not convert" not in err
    if order == "after":
        assert "install() after TrainingArguments: the Trainer's copy of the DeepSpeed config rewritten" in err
