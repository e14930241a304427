# Copyright (c) Microsoft Corporation.
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
# Port of deepspeedai/DeepSpeed tests/unit/v1/zero/test_zero_user_backward.py at
# edaa7221267243c7be7fb49c5d5f5c4fb97b4641: its NVMe case (TestUnmanagedGradientAccumulationNvmeOffload) with the
# helpers it calls, copied unchanged (the `sequential` mark dropped), run with memascend's engine installed
# (memascend_install).

import deepspeed
import memascend_install  # noqa: F401  (installs memascend's engine when the ds_upstream conftest asks)
import pytest
import torch
from deepspeed.accelerator import get_accelerator
from deepspeed.ops.aio import AsyncIOBuilder
from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum
from unit.common import DistributedTest, allclose_on_all_ranks, preferred_dtype
from unit.simple_model import SimpleModel, random_dataloader


def initialize_distributed():
    deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
    device = get_accelerator().current_device_name()
    rank = get_accelerator().current_device()
    dtype = preferred_dtype()
    return device, rank, dtype


def collect_deepspeed_parameters(model_engine, zero_stage):
    """Collect parameters from DeepSpeed engine (handles ZeRO-3 gathering)"""
    params = {}
    for name, param in model_engine.named_parameters():
        clean_name = name.replace('module.', '')
        if zero_stage == 3:
            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                params[clean_name] = param.detach().clone().cpu()
        else:
            params[clean_name] = param.detach().clone().cpu()
    return params


def compare_parameters(params_ddp, params_ds, step_info=""):
    """Compare parameters between DDP and DeepSpeed"""
    step_suffix = f" at {step_info}" if step_info else ""
    assert len(params_ddp) == len(params_ds), \
        f"Parameter count mismatch{step_suffix}: DDP={len(params_ddp)}, DeepSpeed={len(params_ds)}"

    for name in params_ddp.keys():
        assert name in params_ds, f"Parameter {name} missing in DeepSpeed model{step_suffix}"
        # Convert to fp32 for comparison in case of dtype mismatch
        params_ddp_fp32 = params_ddp[name].float()
        params_ds_fp32 = params_ds[name].float()
        allclose_on_all_ranks(params_ddp_fp32,
                              params_ds_fp32,
                              assert_message=f"Parameter {name} mismatch{step_suffix}")


def build_managed_gas_config(zero_stage, gradient_accumulation_steps, managed_gradient_accumulation):
    """fp32 config toggling managed_gradient_accumulation; micro-batch 1 so total_samples == micro-batch count."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "steps_per_print": 1,
        "managed_gradient_accumulation": managed_gradient_accumulation,
        "zero_optimization": {
            "stage": zero_stage,
        },
        "optimizer": {
            "type": "Adam",
            "params": {
                "lr": 1e-3
            }
        },
    }


def _build_unmanaged_offload_config(zero_stage,
                                    gradient_accumulation_steps,
                                    managed,
                                    offload_param=False,
                                    offload_device="cpu",
                                    nvme_path=None):
    config = build_managed_gas_config(zero_stage, gradient_accumulation_steps, managed_gradient_accumulation=managed)
    offload_opt = {"device": offload_device}
    if offload_device == OffloadDeviceEnum.nvme:
        assert nvme_path is not None, "nvme_path is required for NVMe offload"
        offload_opt["nvme_path"] = str(nvme_path)
    config["zero_optimization"]["offload_optimizer"] = offload_opt
    if offload_param:
        offload_p = {"device": offload_device}
        if offload_device == OffloadDeviceEnum.nvme:
            offload_p["nvme_path"] = str(nvme_path)
        config["zero_optimization"]["offload_param"] = offload_p
    if offload_device == OffloadDeviceEnum.nvme:
        # Small sub_group_size so each large param is its own swappable subgroup.
        config["zero_optimization"]["sub_group_size"] = 100
        config["aio"] = {"block_size": 1048576}
    return config


def _run_unmanaged_vs_managed_offload(zero_stage,
                                      gradient_accumulation_steps,
                                      num_cycles,
                                      offload_param=False,
                                      offload_device="cpu",
                                      nvme_path=None,
                                      hidden_dim=4,
                                      label=""):
    device, _, _ = initialize_distributed()

    def make_config(managed):
        return _build_unmanaged_offload_config(zero_stage,
                                               gradient_accumulation_steps,
                                               managed=managed,
                                               offload_param=offload_param,
                                               offload_device=offload_device,
                                               nvme_path=nvme_path)

    torch.manual_seed(42)
    if zero_stage == 3 and offload_device == OffloadDeviceEnum.nvme:
        with deepspeed.zero.Init(config_dict_or_path=make_config(True)):
            model_managed = SimpleModel(hidden_dim=hidden_dim, nlayers=2)
    else:
        model_managed = SimpleModel(hidden_dim=hidden_dim, nlayers=2)
    managed_engine, _, _, _ = deepspeed.initialize(config=make_config(True),
                                                   model=model_managed,
                                                   model_parameters=model_managed.parameters())

    torch.manual_seed(42)
    if zero_stage == 3 and offload_device == OffloadDeviceEnum.nvme:
        with deepspeed.zero.Init(config_dict_or_path=make_config(False)):
            model_unmanaged = SimpleModel(hidden_dim=hidden_dim, nlayers=2)
    else:
        model_unmanaged = SimpleModel(hidden_dim=hidden_dim, nlayers=2)
    unmanaged_engine, _, _, _ = deepspeed.initialize(config=make_config(False),
                                                     model=model_unmanaged,
                                                     model_parameters=model_unmanaged.parameters())

    total_samples = num_cycles * gradient_accumulation_steps
    batches = list(
        random_dataloader(model=managed_engine,
                          total_samples=total_samples,
                          hidden_dim=hidden_dim,
                          device=device,
                          dtype=torch.float32))

    for batch in batches:
        loss = managed_engine(batch[0], batch[1])
        managed_engine.backward(loss)
        managed_engine.step()

    for cycle in range(num_cycles):
        for micro in range(gradient_accumulation_steps):
            batch = batches[cycle * gradient_accumulation_steps + micro]
            loss = unmanaged_engine(batch[0], batch[1])
            unmanaged_engine.backward(loss)
        unmanaged_engine.step()

    managed_params = collect_deepspeed_parameters(managed_engine, zero_stage)
    unmanaged_params = collect_deepspeed_parameters(unmanaged_engine, zero_stage)
    compare_parameters(managed_params, unmanaged_params, label)

    managed_engine.destroy()
    unmanaged_engine.destroy()


class TestUnmanagedGradientAccumulationNvmeOffload(DistributedTest):
    """Unmanaged ZeRO-3 NVMe offload matches managed NVMe offload."""
    world_size = 2

    def _skip_if_nvme_unsupported(self):
        if not deepspeed.ops.__compatible_ops__[AsyncIOBuilder.NAME]:
            pytest.skip("Skip tests since async-io is not compatible")

    def test_unmanaged_matches_managed_optimizer_nvme_offload(self, tmpdir):
        self._skip_if_nvme_unsupported()
        # Large enough that partitioned params exceed MIN_AIO_BYTES and exercise swap_out_gradients.
        _run_unmanaged_vs_managed_offload(zero_stage=3,
                                          gradient_accumulation_steps=2,
                                          num_cycles=2,
                                          offload_device=OffloadDeviceEnum.nvme,
                                          nvme_path=tmpdir,
                                          hidden_dim=1024,
                                          label="unmanaged vs managed optimizer NVMe offload (stage 3)")

    def test_unmanaged_matches_managed_param_nvme_offload(self, tmpdir):
        self._skip_if_nvme_unsupported()
        _run_unmanaged_vs_managed_offload(zero_stage=3,
                                          gradient_accumulation_steps=2,
                                          num_cycles=2,
                                          offload_param=True,
                                          offload_device=OffloadDeviceEnum.nvme,
                                          nvme_path=tmpdir,
                                          hidden_dim=1024,
                                          label="unmanaged vs managed param+optimizer NVMe offload (stage 3)")
