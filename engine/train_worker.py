"""Per-rank training script started by DeepSpeed's launcher (`memascend train` builds the command).

    python -m memascend_engine.train_worker --run-dir RUN [--engine memascend|tuned|stock] [--resume]

Reads RUN/recipe.json and RUN/ds_config.json; builds the tokenizer, the dataset and the model
(Hugging Face safetensors loaded into the zero.Init-partitioned model, or a preset with random
weights); installs the memascend engine unless --engine names stock DeepSpeed (tuned, stock); trains with
metrics in RUN/metrics.jsonl, resumable checkpoints in RUN/checkpoints/ and the final model, a Hugging Face folder, in RUN/export/ (in RUN
itself for a LLaMA-Factory recipe: rundir.final_model_dir).
A stop request (RUN/STOP, SIGINT, or SIGTERM under the CLI's lifeline) finishes the step, checkpoints and exits 0;
the exit mark names the checkpoint. The rank ends at once when the CLI is gone (memascend_cli/run/lifeline.py). Expected
failures write RUN/logs/error-rank<N>.json (one line for the CLI) and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback

from memascend_engine import cpuinfo_cache
from memascend_engine.procfs import io_bytes, status_kib

from memascend_cli.run import rundir


class WorkerError(Exception):
    """An expected failure: the message is the one line the user sees."""


# --- small helpers ------------------------------------------------------------------------------


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _ensure_rank_env() -> None:
    # Without a launcher (python -m ... directly) run as a single rank instead of trying MPI discovery.
    if "RANK" not in os.environ:
        os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"})
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))


def _device() -> str:
    """The accelerator's current device ('cuda:N' under NCCL, 'cpu' on the CPU accelerator)."""
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().current_device_name()


# --- model --------------------------------------------------------------------------------------


def _safetensors_files(model_dir: str) -> list[str]:
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(model_dir, n) for n in names]
    files = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
    if not files:
        raise WorkerError(f"model directory {model_dir} has no *.safetensors weights")
    return [os.path.join(model_dir, n) for n in files]


def load_hf_weights(model, model_dir: str, rank: int) -> int:
    """Copy safetensors weights into the partitioned model one parameter at a time.

    Each parameter is gathered (GatheredParameters with modifier_rank=0), filled on rank 0 and
    re-partitioned on exit, so no rank ever holds more than one full tensor.
    """
    import deepspeed
    import torch
    from safetensors import safe_open

    where = {}
    for path in _safetensors_files(model_dir):
        with safe_open(path, framework="pt") as f:
            for k in f.keys():
                where[k] = path
    loaded = 0
    missing = []
    for name, param in model.named_parameters():
        path = where.get(name)
        if path is None:
            missing.append(name)
            continue
        with deepspeed.zero.GatheredParameters([param], modifier_rank=0):
            if rank == 0:
                with safe_open(path, framework="pt") as f:
                    t = f.get_tensor(name)
                if tuple(t.shape) != tuple(param.shape):
                    raise WorkerError(f"{path}: {name} has shape {tuple(t.shape)}, the model expects {tuple(param.shape)}")
                with torch.no_grad():
                    param.data.copy_(t.to(param.dtype))
        loaded += 1
    if missing:
        raise WorkerError(f"model directory {model_dir}: no weights for {missing[0]}"
                          + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
    return loaded


def build_model_factory(recipe, spec):
    """(zero-argument constructor, hf config): all transformers imports happen before zero.Init."""
    if os.path.isdir(recipe.model):
        from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

        cfg = AutoConfig.from_pretrained(recipe.model, local_files_only=True)
        cls = AutoModelForCausalLM._model_mapping[type(cfg)]

        def make():
            # The weights are loaded right after, so transformers' weight initialisation is skipped: under
            # zero.Init it fails where it zeroes the padding row of the (already partitioned) embedding
            # of a config with pad_token_id. init_weights() still runs for its tie_weights().
            original = PreTrainedModel.initialize_weights
            PreTrainedModel.initialize_weights = lambda self: None
            try:
                return cls(cfg)
            finally:
                PreTrainedModel.initialize_weights = original

        return make, cfg
    from memascend_engine.hf_models import to_hf_config

    cfg = to_hf_config(spec)
    from transformers import AutoModelForCausalLM

    cls = AutoModelForCausalLM._model_mapping[type(cfg)]
    return (lambda: cls(cfg)), cfg


class Reporter:
    """Rank 0's metrics sinks: metrics.jsonl (always; the CLI's live view reads it) and TensorBoard."""

    def __init__(self, run_dir: str, rank: int, report_to: list[str]):
        self.path = rundir.path(run_dir, rundir.METRICS)
        self.rank = rank
        self.tb = None
        if rank == 0 and "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=rundir.path(run_dir, rundir.TENSORBOARD_DIR))
        self.wandb = None
        if rank == 0 and "wandb" in report_to:
            try:
                import wandb
            except ImportError:
                print("memascend: report_to wandb skipped: the wandb package is not installed", file=sys.stderr)
            else:
                # Project and mode from WANDB_PROJECT / WANDB_MODE as the HF Trainer leaves them (offline works).
                self.wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "memascend"), dir=run_dir,
                                        name=os.path.basename(os.path.normpath(run_dir)))

    def __call__(self, record: dict) -> None:
        if self.rank != 0:
            return
        record = {"time": round(time.time(), 3), **record}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        kind, step = record.get("event"), record.get("step", 0)
        if self.wandb is not None and kind in ("step", "eval"):
            prefix = "train" if kind == "step" else "eval"
            self.wandb.log({f"{prefix}/{k}": v for k, v in record.items() if isinstance(v, (int, float))
                            and k not in ("step", "time")}, step=step)
        if self.tb is None:
            return
        if kind == "step":
            for key in ("loss", "lr", "tokens_per_s", "s_per_step", "host_rss_gib", "host_peak_gib", "ssd_read_gbps",
                        "ssd_write_gbps"):
                self.tb.add_scalar(f"train/{key}", record[key], step)
        elif kind == "eval":
            self.tb.add_scalar("eval/loss", record["loss"], step)
        if kind in ("eval", "checkpoint", "done", "stopped"):
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


# --- the run ------------------------------------------------------------------------------------


class Run:
    def __init__(self, args):
        self.args = args
        self.run_dir = os.path.abspath(args.run_dir)
        self.stop_requested = False
        self.stopped: dict = {}
        """{"stopped": step, "checkpoint": path} once the run stopped on a request (for the exit mark)."""
        self.watched = False
        """True when the CLI's lifeline is watched: the CLI is there to escalate a stop, so SIGTERM is a stop request."""

    def metrics(self, record: dict) -> None:
        self.reporter(record)

    def phase(self, name: str, step: int | None = None) -> None:
        """Rank 0 starts `name`: the CLI prints each setup phase with its time and names the phase in its heartbeat
        (memascend_cli/run/train_progress.py); `step` once training began."""
        self.metrics({"event": "phase", "phase": name, **({} if step is None else {"step": step})})

    def main(self) -> None:
        _ensure_rank_env()
        self.rank = _env_int("RANK", 0)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        self.world = _env_int("WORLD_SIZE", 1)
        signal.signal(signal.SIGINT, self._on_sigint)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        from memascend_cli.run.recipe import recipe_from_json_dict

        try:
            with open(rundir.path(self.run_dir, rundir.RECIPE_JSON)) as f:
                recipe = recipe_from_json_dict(json.load(f))
            with open(rundir.path(self.run_dir, rundir.DS_CONFIG)) as f:
                ds_config = json.load(f)
        except OSError as exc:
            raise WorkerError(f"run directory {self.run_dir} is incomplete ({exc.strerror}: {exc.filename}); "
                              "start runs with `memascend train`") from None
        self.recipe = recipe
        from memascend_cli.models import load_model

        spec = load_model(recipe.model)

        # Data: tokenized by `memascend train` before the launch; here only memory-mapped.
        from memascend_engine import data as D

        try:
            with open(rundir.path(self.run_dir, rundir.DATA_JSON)) as f:
                prepared = json.load(f)
            cache = D.TokenCache(prepared["cache_dir"])
        except (OSError, ValueError, KeyError, D.DataError) as exc:
            raise WorkerError(f"the tokenized data of {self.run_dir} is missing ({exc}); start runs with "
                              "`memascend train`") from None
        train, val = cache.train, cache.validation
        from memascend_cli.run.recipe import total_steps

        # The same function and inputs as the CLI, which wrote the scheduler's total_num_steps.
        total = total_steps(recipe, len(train), self.world)
        self.reporter = Reporter(self.run_dir, self.rank, recipe.report_to)
        self.phase("starting DeepSpeed")

        import deepspeed
        import torch
        from memascend_engine.ds_internals.version import check_version

        try:  # stock runs too: their checkpoints and resume read the optimizer's internals
            check_version()
        except RuntimeError as exc:
            raise WorkerError(str(exc)) from None
        from memascend_engine.ds_internals import jit_ops

        # DeepSpeed's built ops load without torch's build lock; a wait on a lock is a phase the CLI names.
        jit_ops.enable(on_wait=lambda w: self.phase(f"waiting on {w['on']} (held by {', '.join(w['holders'])})"))
        deepspeed.init_distributed(dist_backend="gloo" if os.environ.get("DS_ACCELERATOR") == "cpu" else None)
        from deepspeed.accelerator import get_accelerator

        if get_accelerator().device_name() != "cpu":
            # One device per rank before any collective (NCCL binds a communicator to the current device).
            get_accelerator().set_device(self.local_rank)
        installed = None
        if self.args.engine == "memascend":
            from memascend_engine.cluster_preflight import check_nodes

            self.region = check_nodes(self.run_dir, recipe.region, local_rank=self.local_rank)
            installed = self._install_engine(ds_config, spec)
        # zero.Init swaps each parameter out as it is built, and loading the weights rewrites every one.
        self.phase("writing parameters to the " + ("region" if self.args.engine == "memascend" else "swap files"))
        make_model, hf_config = build_model_factory(recipe, spec)
        torch.manual_seed(recipe.seed)
        # No dtype= for zero.Init: it would override the config's precision (measure_ds_buffers.py).
        with deepspeed.zero.Init(config_dict_or_path=ds_config):
            model = make_model()
        resume_dir = self._fill_weights(model, recipe)
        if recipe.chunked_loss:
            from memascend_engine import chunked_loss

            try:
                chunked_loss.enable(model)
            except ValueError as exc:
                raise WorkerError(f"{exc}; set chunked_loss: false in the recipe") from None
        if recipe.gradient_checkpointing:
            if installed is not None and hasattr(installed, "enable_offloaded_checkpointing"):
                installed.enable_offloaded_checkpointing(model)
            else:
                model.gradient_checkpointing_enable()
        if self.rank == 0:
            # What DeepSpeed really receives (after the engine's install); `train --dry-run` printed ds_config.json.
            with open(rundir.path(self.run_dir, rundir.EFFECTIVE_DS_CONFIG), "w") as f:
                json.dump(ds_config, f, indent=2, sort_keys=True)
        self.phase("initializing DeepSpeed")  # the optimizer and its states in the region
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
        if self.rank == 0:
            from memascend_engine.export import write_params_file

            write_params_file(model, prepared["hf_dir"])
        self.hf_dir = prepared["hf_dir"]
        self.train_loop(engine, model, train, val, total, resume_dir, installed)
        self.reporter.close()
        if installed is not None:
            installed.uninstall()

    def _fill_weights(self, model, recipe) -> str | None:
        """The checkpoint to resume from (its weights come with it), else None after loading the model directory's
        weights, or initialising a preset's at random."""
        if self.args.resume:
            from memascend_engine.run_checkpoint import latest_complete

            resume_dir = latest_complete(rundir.path(self.run_dir, rundir.CHECKPOINTS))
            if resume_dir is None:
                raise WorkerError(f"--resume: no complete checkpoint in {rundir.path(self.run_dir, rundir.CHECKPOINTS)}")
            return resume_dir
        if os.path.isdir(recipe.model):
            load_hf_weights(model, recipe.model, self.rank)
        else:
            from memascend_engine.hf_models import init_weights_under_zero3

            init_weights_under_zero3(model)  # a preset with random weights
        return None

    def _install_engine(self, ds_config, spec):
        try:
            import memascend_engine

            install = memascend_engine.install
        except (ImportError, AttributeError) as exc:
            raise WorkerError(f"the memascend engine is not available in this install ({exc}); "
                              "run with --engine tuned for stock DeepSpeed") from None
        kwargs = {"region": self.region, "model_spec": spec, "rank": self.local_rank}
        kwargs["options"] = memascend_engine.EngineOptions(**self._engine_options())
        return install(ds_config, **kwargs)

    def _engine_options(self) -> dict:
        """EngineOptions fields the CLI's plan chose (RUN/engine.json): host-budget windows, checkpoint offload."""
        try:
            with open(rundir.path(self.run_dir, rundir.ENGINE_JSON)) as f:
                chosen = json.load(f)
        except FileNotFoundError:
            return {}
        if chosen.get("windows"):
            from memascend_cli.planner.zero import EngineWindows

            chosen["windows"] = EngineWindows(**chosen["windows"])
        return chosen

    def _on_sigterm(self, signum, frame):
        if self.watched:
            # systemd and Slurm's scancel signal every process of the job, and DeepSpeed's launcher passes its own
            # SIGTERM on (deepspeed/launcher/launch.py sigkill_handler): finish the step and checkpoint. Stopping at
            # once is the CLI's part (a second signal or its grace: SIGKILL); the launcher SIGKILLs after 30 s.
            self.stop_requested = True
            return
        # The launcher terminates the survivors when a rank dies: the mark tells the CLI this rank did not die first.
        try:
            write_exit_mark(self.run_dir, self.rank, {"sigterm": True})
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    def _on_sigint(self, signum, frame):
        self.stop_requested = True

    def _should_stop(self, step: int) -> bool:
        import torch
        import torch.distributed as dist

        local = self.stop_requested or os.path.exists(rundir.path(self.run_dir, rundir.STOP_FILE))
        # Fault injection for tests and drills: behave as if Ctrl-C came during step N.
        local = local or os.environ.get("MEMASCEND_FAULT_STOP_AT_STEP") == str(step)
        flag = torch.tensor([1.0 if local else 0.0], device=_device())  # NCCL reduces device tensors only
        if self.world > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
        return bool(flag.item() > 0)

    def _batch(self, split, rows):
        """The micro-batch, read from the memory-mapped cache, on the accelerator's device (DeepSpeed's engine
        does not move inputs)."""
        import torch

        device = _device()
        return {k: torch.from_numpy(v).to(device) for k, v in split.batch(rows).items()}

    def _all_sum(self, values: list[float]) -> list[float]:
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=_device())  # NCCL reduces device tensors only
        if self.world > 1:
            dist.all_reduce(t)
        return t.tolist()

    def evaluate(self, engine, val) -> float | None:
        import torch
        from memascend_engine.data import IGNORE_INDEX

        if val is None or len(val) == 0:
            return None
        mb = self.recipe.micro_batch
        per_global = mb * self.world
        total_loss, total_tokens = 0.0, 0.0
        engine.eval()
        with torch.no_grad():
            for start in range(0, len(val), per_global):
                # Every rank runs the same number of forwards (ZeRO-3 gathers are collective);
                # a rank past the end repeats row 0 with zero weight.
                rows = [start + self.rank * mb + j for j in range(mb)]
                weight = [1.0 if r < len(val) else 0.0 for r in rows]
                rows = [r if r < len(val) else 0 for r in rows]
                batch = self._batch(val, rows)
                out = engine(**batch)
                n = float(((batch["labels"][:, 1:] != IGNORE_INDEX).sum()).item()) * (sum(weight) / len(weight))
                total_loss += float(out.loss.item()) * n
                total_tokens += n
        engine.train()
        # Eval forwards leave gathered parameters holding the param swap buffers; release them so
        # the next gather (training, export) finds free buffers.
        engine.empty_partition_cache()
        loss, tokens = self._all_sum([total_loss, total_tokens])
        return loss / tokens if tokens else None

    def train_loop(self, engine, model, train, val, total, resume_dir, installed) -> None:
        import torch
        from memascend_engine import run_checkpoint as C
        from memascend_engine.data import micro_batch_rows

        r = self.recipe
        step = 0
        tokens_seen = 0
        if resume_dir is not None:
            self.phase("loading the checkpoint")
            state = C.load(engine, resume_dir, rank=self.rank, world_size=self.world)
            step, tokens_seen = state["step"], state.get("tokens_seen", 0)
            self.metrics({"event": "resumed", "step": step, "path": resume_dir})
        else:
            self.metrics({"event": "start", "total_steps": total, "world_size": self.world,
                          "engine": self.args.engine,
                          "train_sequences": len(train), "validation_sequences": len(val) if val else 0})
        root = rundir.path(self.run_dir, rundir.CHECKPOINTS)
        last_saved = step
        io0 = io_bytes()
        t_last = time.time()
        while step < total:
            t0 = time.time()
            losses = []
            tokens = 0
            for a in range(r.grad_accum):
                micro_index = step * r.grad_accum + a
                rows = micro_batch_rows(len(train), r.seed, micro_index, micro_batch=r.micro_batch,
                                        world_size=self.world, rank=self.rank)
                batch = self._batch(train, rows)
                out = engine(**batch)
                engine.backward(out.loss)
                engine.step()
                losses.append(float(out.loss.item()))
                tokens += int(batch["attention_mask"].sum()) if "attention_mask" in batch else batch["input_ids"].numel()
            step += 1
            elapsed = time.time() - t0
            io1 = io_bytes()
            rss_kib, hwm_kib = status_kib("VmRSS"), status_kib("VmHWM")
            loss_sum, tok_sum, rss_sum, hwm_sum, rd, wr = self._all_sum(
                [sum(losses) / len(losses), tokens, rss_kib, hwm_kib, io1["read_bytes"] - io0["read_bytes"],
                 io1["write_bytes"] - io0["write_bytes"]])
            tokens_seen += int(tok_sum)
            if step % r.log_every == 0 or step == total:
                window = time.time() - t_last
                norm = engine.get_global_grad_norm()  # before clipping: says whether the step clipped
                grad_norm = None if norm is None else float(norm)
                self.metrics({"event": "step", "step": step, "total_steps": total, "loss": loss_sum / self.world,
                              "lr": float(engine.get_lr()[0]), "grad_norm": grad_norm,
                              "tokens_per_s": tok_sum / elapsed if elapsed else 0.0,
                              "s_per_step": elapsed, "tokens_seen": tokens_seen,
                              # Sums over ranks: the node's host memory when all ranks share a node.
                              "host_rss_gib": rss_sum / 1024**2, "host_peak_gib": hwm_sum / 1024**2,
                              "ssd_read_gbps": rd / window / 1e9 if window else 0.0,
                              "ssd_write_gbps": wr / window / 1e9 if window else 0.0,
                              **({"engine_stats": installed.stats()} if installed is not None and hasattr(installed, "stats") else {})})
                io0, t_last = io1, time.time()
            else:  # a step the log skips: for the CLI's first-step line and heartbeat, not a metrics line
                self.metrics({"event": "progress", "step": step, "total_steps": total, "loss": loss_sum / self.world,
                              "tokens_per_s": tok_sum / elapsed if elapsed else 0.0, "s_per_step": elapsed,
                              "tokens_seen": tokens_seen})
            if r.eval_every and step % r.eval_every == 0 and step < total:
                self.phase("validating", step)
                vl = self.evaluate(engine, val)
                if vl is not None:
                    self.metrics({"event": "eval", "step": step, "loss": vl})
            stop = self._should_stop(step)
            if (r.checkpoint_every and step % r.checkpoint_every == 0) or stop or step == total:
                self.phase("saving a checkpoint", step)
                path = C.save(engine, root, step, {"tokens_seen": tokens_seen, "micro_batches": step * r.grad_accum,
                                                   "seed": r.seed},
                              rank=self.rank, world_size=self.world, keep=r.keep_checkpoints, barrier=self._barrier)
                last_saved = step
                self.metrics({"event": "checkpoint", "step": step, "path": path})
                if os.environ.get("MEMASCEND_FAULT_KILL_AFTER_CHECKPOINT") == str(step):
                    # Fault injection: die like an OOM kill right after a checkpoint completed.
                    os.kill(os.getpid(), signal.SIGKILL)
            if stop:
                self.metrics({"event": "stopped", "step": step, "path": path})
                self.stopped = {"stopped": step, "checkpoint": path}
                return
        del last_saved
        if val is not None and len(val):
            self.phase("validating", step)
        vl = self.evaluate(engine, val)
        if vl is not None:
            self.metrics({"event": "eval", "step": step, "loss": vl})
        if r.export:
            from memascend_engine.export import export_model

            self.phase("exporting the model", step)
            engine.empty_partition_cache()
            out = export_model(model, rundir.final_model_dir(self.run_dir, in_output_dir=r.export_in_output_dir),
                               self.hf_dir, self.rank, r.precision, merge=r.export_in_output_dir)
            if self.rank == 0:
                self.metrics({"event": "export", "step": step, "path": out})
        self.metrics({"event": "done", "step": step})
        del torch

    def _barrier(self) -> None:
        import torch.distributed as dist

        if self.world > 1:
            dist.barrier()


def _write_error(run_dir: str, rank: int, message: str, hint: str | None = None) -> None:
    path = rundir.error_file(run_dir, rank)
    log_dir = os.path.dirname(path)
    try:
        os.makedirs(log_dir, exist_ok=True)
        with open(path, "w") as f:
            json.dump({"rank": rank, "message": message, "log": log_dir, "hint": hint}, f)
    except OSError:
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--engine", choices=("memascend", "tuned", "stock"), default="memascend")
    ap.add_argument("--resume", action="store_true")
    args = ap.parse_args(argv)
    cpuinfo_cache.enable()
    run = Run(args)
    from memascend_cli.run import lifeline

    run.watched = lifeline.watch()  # before anything slow: a rank started after the CLI died ends here
    rank = _env_int("RANK", 0)
    _write_started(rundir.started_file(run.run_dir, rank))
    code = 1  # also when a BaseException escapes: Python reports it and exits 1
    try:
        code = _main(run, rank)
    finally:
        write_exit_mark(run.run_dir, rank, {"code": code, **run.stopped})
    return code


def _write_started(path: str) -> None:
    # The pid lets the CLI see which rank died first (memascend_cli.run.launch.RankWatch).
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(str(os.getpid()))


def write_exit_mark(run_dir: str, rank: int, doc: dict) -> None:
    """RUN/logs/exit-rank<N>.json: this rank ended on its own terms (memascend_cli.run.launch tells killed ranks by its
    absence)."""
    path = rundir.exit_file(run_dir, rank)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f)


def _main(run: Run, rank: int) -> int:
    try:
        run.main()
    except WorkerError as exc:
        msg = f"rank {rank}: {exc}"
        print(f"error: {msg}", file=sys.stderr, flush=True)
        _write_error(run.run_dir, rank, msg)
        return 1
    except Exception as exc:  # noqa: BLE001 — a rank must always leave a one-line reason
        from memascend_cli.errors import MemascendError

        traceback.print_exc()
        text = exc.message if isinstance(exc, MemascendError) else f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        _write_error(run.run_dir, rank, f"rank {rank} failed: {text}",
                     exc.hint if isinstance(exc, MemascendError) else None)
        return 1
    return 0


if __name__ == "__main__":
    from memascend_engine.hard_exit import exit_after_flush

    exit_after_flush(main())
