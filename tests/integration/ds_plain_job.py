"""A plain DeepSpeed training script as its user writes it, without memascend (run by test_launch_cli.py through
DeepSpeed's launcher): the config comes as a path, through `--deepspeed_config` for deepspeed.initialize and as
`config_dict_or_path` for zero.Init, which builds the model partitioned.

usage: deepspeed ds_plain_job.py --deepspeed --deepspeed_config CONFIG.json --out OUT.json
"""

from __future__ import annotations

import argparse
import json

import deepspeed
import torch

STEPS = 3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--local_rank", type=int, default=0)
    args = deepspeed.add_config_arguments(parser).parse_args()
    deepspeed.init_distributed()
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=args.deepspeed_config):
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    engine, *_ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
    losses = []
    for _ in range(STEPS):
        x = torch.randn(4, 256, dtype=torch.bfloat16)
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    with open(args.out, "w") as f:
        json.dump({"losses": losses}, f)


if __name__ == "__main__":
    main()
