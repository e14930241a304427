"""The CPU ranks' determinism environment (run/cpu_env.py: one home for `train` and every `bench` run), the record of
what decided a run's losses (memascend_engine.determinism) and how the bench keeps it (bench/outcome.py)."""

from __future__ import annotations

import pytest

from memascend_cli.bench import configs
from memascend_cli.bench.outcome import summarize_events
from memascend_cli.models import load_model
from memascend_cli.run.cpu_env import cpu_rank_env, kernel_env
from memascend_cli.run.launch import build_launch
from memascend_cli.run.recipe import recipe_from_dict


@pytest.mark.parametrize("cores, ranks, threads", [(2, 1, "2"), (2, 2, "1"), (16, 3, "5"), (1, 4, "1")])
def test_each_rank_gets_its_share_of_the_cores_and_mkl_a_fixed_branch(cores, ranks, threads):
    assert cpu_rank_env(cores, ranks) == {"OMP_NUM_THREADS": threads, "MKL_DYNAMIC": "FALSE", "MKL_CBWR": "AUTO"}


def test_kernel_env_keeps_the_kernel_variables_only():
    env = {"PATH": "/bin", "OMP_NUM_THREADS": "2", "MKL_DYNAMIC": "FALSE", "ONEDNN_MAX_CPU_ISA": "AVX2",
           "KMP_AFFINITY": "compact", "DS_ACCELERATOR": "cpu", "ATEN_CPU_CAPABILITY": "avx2"}
    assert kernel_env(env) == {"ATEN_CPU_CAPABILITY": "avx2", "KMP_AFFINITY": "compact", "MKL_DYNAMIC": "FALSE",
                               "OMP_NUM_THREADS": "2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


@pytest.mark.parametrize("ranks", [1, 2])
def test_train_and_every_bench_mode_give_cpu_ranks_the_same_environment(ranks):
    """The environment `train` launches CPU ranks with is the one each bench run's child gets, whatever its mode
    (equal knobs), and a caller's own thread settings do not leak into a run."""
    spec = load_model("tiny-llama")
    launch = build_launch(recipe_from_dict({"model": "tiny-llama", "dataset": "d.jsonl", "ranks": ranks}), "/runs/a",
                          num_gpus=0, cpu_cores=4, engine="tuned", resume=False, python_executable="/v/bin/python")
    base = {"OMP_NUM_THREADS": "7", "MKL_DYNAMIC": "TRUE"}
    for mode in ("stock", "tuned", "memascend"):
        cfg = configs.build_ds_config(mode, spec, micro_batch=1, dtype="bf16", nvme_dir="/x", ranks=ranks)
        env = configs.child_env(mode, cfg, base, cpu_cores=4, ranks=ranks)
        assert kernel_env(env) == kernel_env(launch.env) == cpu_rank_env(4, ranks), mode


def test_a_cuda_bench_child_keeps_the_caller_s_threads():
    spec = load_model("tiny-llama")
    cfg = configs.build_ds_config("tuned", spec, micro_batch=1, dtype="bf16", nvme_dir="/x", ranks=1)
    env = configs.child_env("tuned", cfg, {"OMP_NUM_THREADS": "7"}, cpu_cores=4, ranks=1, accelerator="cuda")
    assert kernel_env(env) == {"OMP_NUM_THREADS": "7"}


def _final(rank: int, crc: str, seconds: float) -> dict:
    return {"event": "final", "rank": rank, "io": {"read_bytes": 0, "write_bytes": 0},
            "io_steps": {"read_bytes": 0, "write_bytes": 0},
            "determinism": {"torch_threads": 1, "interop_threads": 1, "cpu_capability": "AVX512",
                            "env": {"OMP_NUM_THREADS": "1"}, "param_crc32": crc, "param_bytes": 64,
                            "param_digest_s": seconds}}


def test_the_record_keeps_rank_0_s_kernels_and_every_rank_s_digest_in_rank_order():
    out = summarize_events({1: [_final(1, "0000beef", 0.4)], 0: [_final(0, "0000cafe", 0.2)]}, micro_batch=1,
                           seq_len=8, ranks=2)
    assert out["determinism"] == {"torch_threads": 1, "interop_threads": 1, "cpu_capability": "AVX512",
                                  "env": {"OMP_NUM_THREADS": "1"}, "param_crc32": ["0000cafe", "0000beef"],
                                  "param_bytes": 64, "param_digest_s": 0.4}


def test_a_record_from_a_child_without_the_digest_has_none():
    final = {k: v for k, v in _final(0, "0", 0.1).items() if k != "determinism"}
    assert "determinism" not in summarize_events({0: [final]}, micro_batch=1, seq_len=8, ranks=1)


def test_the_digest_moves_with_one_ulp_of_one_parameter_and_only_then():
    torch = pytest.importorskip("torch")
    from memascend_engine.determinism import param_digest

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.LayerNorm(4)).to(torch.bfloat16)

    a, b = model(), model()
    da = param_digest(a)
    assert da["param_crc32"] == param_digest(b)["param_crc32"]
    assert da["param_bytes"] == 2 * (8 * 4 + 4 + 4 + 4)
    with torch.no_grad():
        w = b[0].weight.view(-1)
        w[3] = torch.nextafter(w[3], torch.tensor(float("inf"), dtype=w.dtype))
    assert param_digest(b)["param_crc32"] != da["param_crc32"]
    emb, head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # tied, as a model with tie_word_embeddings: hashed once
    assert param_digest(torch.nn.Sequential(emb, head))["param_bytes"] == 4 * 10 * 4


def test_the_kernel_record_reads_this_process(monkeypatch):
    torch = pytest.importorskip("torch")
    from memascend_engine.determinism import kernels

    monkeypatch.setenv("MKL_CBWR", "AUTO")
    k = kernels()
    assert k["torch_threads"] == torch.get_num_threads() >= 1
    assert k["cpu_capability"] == torch.backends.cpu.get_cpu_capability() != ""
    assert k["env"]["MKL_CBWR"] == "AUTO" and "PATH" not in k["env"]
