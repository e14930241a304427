"""Property-based fuzzing (hypothesis) of everything a user types or writes: `plan`, `prepare-ssd` and `train`
arguments, recipe YAML files, model YAML files and config.json files (also ones that are not valid YAML or JSON, and
numbers that overflow).

Every case runs the real CLI in-process (memascend_cli.app.main, exit codes and error handling included) and must end
in exit 0 or 1, or in exit 2 with exactly one `error:` line (optionally followed by `hint:` lines) on stderr: never an
exception escaping main (a traceback). Side effects stay in a fresh temporary directory per case (the working
directory too): prepare-ssd only ever gets targets there, /dev/null or a /dev path that does not exist, and real
writes only of small regions without the bandwidth probe; train always runs with --dry-run.

Default run: FAST_EXAMPLES cases per property. The `long` tests (scripts/record_tests.py --long, recorded in
docs/results/reliability.md) run SLOW_EXAMPLES_PER_COMMAND (2,000) per command, split evenly over its properties: plan
(arguments, model files), prepare-ssd (arguments), train (arguments, recipe files).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from memascend_cli.app import main  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "presets", "train", "tiny-cpu.yaml")
FAST_EXAMPLES = 30
SLOW_EXAMPLES_PER_COMMAND = 2000
PRESETS = sorted(n[:-5] for n in os.listdir(os.path.join(REPO, "presets", "models")) if n.endswith(".yaml"))
PROFILES = sorted(n[:-5] for n in os.listdir(os.path.join(REPO, "presets", "hardware")) if n.endswith(".yaml"))


# --- running a case ---------------------------------------------------------------------------------------------


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `memascend ARGV`; an exception escaping main propagates (the failure)."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def check(argv: list[str]) -> int:
    code, _, err = run_cli(argv)
    assert code in (0, 1, 2), (argv, code, err[-2000:])
    assert "Traceback" not in err, (argv, err[-3000:])
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [i for i, line in enumerate(lines) if line.startswith("error:")]
    if code == 2:
        assert len(errors) == 1, (argv, err[-2000:])
    if errors:
        assert len(errors) == 1 and all(line.startswith("hint:") for line in lines[errors[0] + 1:]), (argv, err[-2000:])
    return code


@contextlib.contextmanager
def workdir():
    """A fresh temporary directory, also the working directory (relative paths land there)."""
    old = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="memascend-fuzz-") as d:
        os.chdir(d)
        try:
            yield d
        finally:
            os.chdir(old)


def fuzz(strategy, examples: int):
    return lambda f: settings(max_examples=examples, deadline=None, database=None,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                                     HealthCheck.data_too_large])(given(strategy)(f))


# --- values -----------------------------------------------------------------------------------------------------

TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
NUMBERS = st.one_of(
    st.integers(-10**30, 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["0", "-1", "1e400", "-1e400", "1e-400", "nan", "inf", "-inf", "0x10", "1_000", "９", "9" * 40,
                     "2.5", ".", "1e", "--1"]),
    TEXT,
)
UNITS = st.sampled_from(["", "GiB", "GB", "TiB", "TB", "MiB", "KiB", "B", "gib", " GiB", "XB", "%", "G", "k"])
SIZES = st.one_of(st.builds(lambda n, u: n + u, NUMBERS, UNITS), st.sampled_from(["unlimited", "none", ""]), TEXT)
INTS = st.one_of(st.integers(-10**25, 10**25).map(str), st.sampled_from(["0", "-1", "1e3", "2.5", "abc", ""]), TEXT)


def options(table: dict, flags: list[str]):
    """A random subset of `table`'s options (each with a value) and of `flags`, in random order."""
    pair = st.sampled_from(sorted(table)).flatmap(lambda k: table[k].map(lambda v: [k, v]))
    return st.tuples(st.lists(pair, max_size=6), st.lists(st.sampled_from(flags), max_size=3, unique=True)).map(
        lambda t: [x for p in t[0] for x in p] + t[1])


# --- plan -------------------------------------------------------------------------------------------------------

PLAN_OPTIONS = {
    "--model": st.one_of(st.sampled_from(PRESETS + ["nope", "../x", "", "/", "x.yaml", "x.json", "Qwen2.5-7B"]), TEXT),
    "--seq-len": INTS, "--micro-batch": INTS, "--grad-accum": INTS, "--ranks": INTS, "--gpus": INTS, "--nodes": INTS,
    "--param-buffer-count": INTS, "--optimizer-buffer-count": INTS,
    "--dtype": st.one_of(st.sampled_from(["bf16", "fp16", "fp32", "int8", ""]), TEXT),
    "--grad-accum-dtype": st.one_of(st.sampled_from(["bf16", "fp16", "fp32", "fp64"]), TEXT),
    "--checkpointing": st.one_of(st.sampled_from(["offload", "full", "none", "selective"]), TEXT),
    "--hardware": st.one_of(st.sampled_from(PROFILES + ["nope", "", "/etc/hostname", "x.yaml"]), TEXT),
    "--nvme-path": st.sampled_from([".", "/nonexistent/x", "/dev/null", "", "sub", "/proc"]),
    "--dram": SIZES, "--gpu-mem": SIZES, "--nvme-free": SIZES, "--memlock": SIZES, "--nvme-read-gbps": NUMBERS,
    "--deepspeed-version": st.one_of(st.sampled_from(["0.19.8", "0.16.3", "0.19", "1.0.0", "99.99.99", "abc", ""]),
                                     TEXT),
    "--pin-backend": st.one_of(st.sampled_from(["torch", "native", ""]), TEXT),
    "--sub-group-size": NUMBERS, "--param-buffer-size": NUMBERS, "--max-in-cpu": NUMBERS,
    "--reduce-bucket-size": NUMBERS,
    "--engine": st.one_of(st.sampled_from(["memascend", "stock", "baseline", "tuned", "both"]), TEXT),
}
PLAN_FLAGS = ["--json", "--details", "--list-models", "--no-search", "--pipeline", "--liger", "--no-zero-init",
              "--flash-attn", "--no-pin-memory", "--bogus"]


def plan_args_case(args: list[str]) -> None:
    with workdir():
        check(["plan", *args])


# --- model files (plan --model FILE) ------------------------------------------------------------------------------

MODEL_KEYS = ["model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "head_dim", "tie_word_embeddings", "attention_bias", "mlp_bias",
              "max_position_embeddings", "published_num_params", "name", "source", "family"]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True), TEXT,
    st.sampled_from(["llama", "qwen2", "qwen3", "mistral", "gpt2", 0, 1, 2, 4, 8, 64, 128, 4096, 10**12]),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(TEXT, inner, max_size=3)), max_leaves=6)
GOOD_MODEL = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100}
MODEL_DOCS = st.one_of(
    # A valid spec with some keys replaced or removed, or extra keys.
    st.tuples(st.dictionaries(st.sampled_from(MODEL_KEYS), VALUES, max_size=4),
              st.lists(st.sampled_from(sorted(GOOD_MODEL)), max_size=2), st.dictionaries(TEXT, SCALARS, max_size=2))
    .map(lambda t: {**{k: v for k, v in GOOD_MODEL.items() if k not in t[1]}, **t[0], **t[2]}),
    st.dictionaries(st.sampled_from(MODEL_KEYS), VALUES, max_size=8),
    VALUES,
)
RAW_TEXT = st.one_of(
    st.text(max_size=80),
    st.binary(max_size=80).map(lambda b: b.decode("latin-1")),
    st.sampled_from(["{", "[1, 2", "a: [", ": :", "\t- x\n  y: z", "!!python/object:os.system {}", "key: *alias",
                     "%YAML 9.9\n---\na: 1", "{\"hidden_size\": NaN}", "\ufeff{}", "a: 1e400", "--- !!binary x"]),
)
MODEL_FILES = st.tuples(st.sampled_from(["model.yaml", "model.yml", "config.json", "dir/config.json", "dir"]),
                        st.one_of(MODEL_DOCS.map(lambda d: ("doc", d)), RAW_TEXT.map(lambda t: ("raw", t))),
                        options({"--seq-len": INTS, "--dram": SIZES}, ["--json", "--no-search"]))


def _write_model(name: str, content) -> str:
    kind, value = content
    path = os.path.join("dir", "config.json") if name == "dir" else name
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if kind == "raw":
        text = value
    elif path.endswith(".json"):
        text = json.dumps(value, default=str)
    else:
        text = yaml.safe_dump(value, allow_unicode=True)
    with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)
    return "dir" if name == "dir" else path


def model_file_case(case) -> None:
    name, content, args = case
    with workdir():
        check(["plan", "--model", _write_model(name, content), *args])


# --- prepare-ssd --------------------------------------------------------------------------------------------------

TARGETS = st.one_of(
    st.sampled_from(["new.region", "existing.region", "plain.bin", "adir", "missing/dir/x.region", "/dev/null",
                     "/dev/memascend-no-such-disk", "", ".", "sub/../new2.region"]),
    # Relative names only: the working directory is the case's temporary directory.
    TEXT.filter(lambda t: not t.startswith(("/", "~")) and ".." not in t and t.strip() not in ("", ".")),
)
PREPARE_OPTIONS = {"--size": SIZES, "--ranks": INTS, "--label": TEXT, "--probe-mib": INTS}
PREPARE_FLAGS = ["--info", "--wipe", "--dry-run", "--yes", "--force", "--json", "--no-probe", "--list"]
SMALL_BYTES = 64 << 20


def _setup_targets() -> None:
    run_cli(["prepare-ssd", "existing.region", "--size", "16MiB", "--yes", "--no-probe"])
    with open("plain.bin", "wb") as f:
        f.write(os.urandom(4096))
    os.mkdir("adir")


def _safe(args: list[str]) -> list[str]:
    """Real writes only of small regions, never with the bandwidth probe (its size is fuzzed too)."""
    from memascend_cli.units import parse_size

    if "--dry-run" in args or "--info" in args or "--list" in args:
        return args
    big = False
    for i, a in enumerate(args[:-1]):
        if a == "--size":
            try:
                big = parse_size(args[i + 1], "--size") > SMALL_BYTES
            except Exception:  # noqa: BLE001 - the CLI reports it; here only the size decides
                big = False
    return [*args, "--dry-run"] if big else [*args, "--no-probe"]


def prepare_case(case) -> None:
    target, args = case
    with workdir():
        _setup_targets()
        check(["prepare-ssd", *([target] if target is not None else []), *_safe(args)])


PREPARE_CASES = st.tuples(st.one_of(st.none(), TARGETS), options(PREPARE_OPTIONS, PREPARE_FLAGS))


# --- train (arguments) ---------------------------------------------------------------------------------------------

RECIPE_KEYS = ["model", "tokenizer", "dataset", "dataset.path", "dataset.format", "dataset.packing",
               "dataset.validation_split", "dataset.text_field", "output_dir", "seq_len", "micro_batch", "grad_accum",
               "steps", "epochs", "lr", "weight_decay", "adam_betas", "max_grad_norm", "schedule",
               "schedule.name", "schedule.warmup_steps", "schedule.min_lr_ratio", "gradient_checkpointing",
               "precision", "seed", "region", "region_size", "swap_dir", "log_every", "eval_every", "checkpoint_every",
               "keep_checkpoints", "export", "ranks", "hostfile", "num_nodes", "master_port", "bogus", "dataset.bogus"]
SET_VALUES = st.one_of(NUMBERS, SIZES, st.sampled_from(["true", "false", "null", "[0.9, 0.99]", "[1", "{a: 1}", "~",
                                                        "tiny-llama", "cosine", "bf16", "alpaca", "x.jsonl"]), TEXT)
TRAIN_OPTIONS = {
    "--steps": INTS, "--seq-len": INTS, "--micro-batch": INTS, "--lr": NUMBERS,
    "--model": st.one_of(st.sampled_from(PRESETS + ["nope", "", "adir", "plain.bin"]), TEXT),
    "--region": st.sampled_from(["existing.region", "plain.bin", "adir", "/dev/null", "nope.region", ""]),
    "--set": st.one_of(st.builds(lambda k, v: f"{k}={v}", st.sampled_from(RECIPE_KEYS), SET_VALUES), TEXT),
    "--output-dir": st.sampled_from(["run", "run2", "plain.bin", "adir", ""]),
}
TRAIN_FLAGS = ["--dry-run", "--resume", "--force"]


def train_args_case(case) -> None:
    recipe, args = case
    with workdir():
        _setup_targets()
        check(["train", recipe, "--dry-run", "--output-dir", "run", *args])


TRAIN_CASES = st.tuples(st.sampled_from([TINY, "tiny-cpu", "nope.yaml", "adir", "plain.bin", ""]),
                        options(TRAIN_OPTIONS, TRAIN_FLAGS))


# --- train (recipe files) -------------------------------------------------------------------------------------------

with open(TINY, encoding="utf-8") as _f:
    GOOD_RECIPE = yaml.safe_load(_f)
GOOD_RECIPE["tokenizer"] = os.path.join(REPO, "presets", "train", GOOD_RECIPE["tokenizer"])
GOOD_RECIPE["dataset"]["path"] = os.path.join(REPO, "presets", "train", GOOD_RECIPE["dataset"]["path"])


def _nested_set(doc: dict, dotted: str, value) -> dict:
    out = json.loads(json.dumps(doc))
    node = out
    *parents, last = dotted.split(".")
    for p in parents:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[last] = value
    return out


RECIPE_DOCS = st.one_of(
    st.lists(st.tuples(st.sampled_from(RECIPE_KEYS), VALUES), max_size=4).map(
        lambda kvs: _apply_all(GOOD_RECIPE, kvs)),
    st.dictionaries(st.sampled_from(RECIPE_KEYS), VALUES, max_size=6),
    VALUES,
)


def _apply_all(doc, kvs):
    for k, v in kvs:
        doc = _nested_set(doc, k, v)
    return doc


RECIPE_FILES = st.one_of(RECIPE_DOCS.map(lambda d: ("doc", d)), RAW_TEXT.map(lambda t: ("raw", t)))


def recipe_file_case(content) -> None:
    kind, value = content
    with workdir():
        text = value if kind == "raw" else yaml.safe_dump(value, allow_unicode=True)
        with open("recipe.yaml", "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
        check(["train", "recipe.yaml", "--dry-run", "--output-dir", "run"])


# --- the tests: a few cases in the fast suite, 2,000 per property in the slow one -----------------------------------

CASES = {
    "plan_args": (options(PLAN_OPTIONS, PLAN_FLAGS), plan_args_case),
    "plan_model_files": (MODEL_FILES, model_file_case),
    "prepare_ssd_args": (PREPARE_CASES, prepare_case),
    "train_args": (TRAIN_CASES, train_args_case),
    "train_recipe_files": (RECIPE_FILES, recipe_file_case),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fuzzed_inputs_never_crash(name):
    strategy, case = CASES[name]
    fuzz(strategy, FAST_EXAMPLES)(case)()


def _command(name: str) -> str:
    return name.split("_")[0] if not name.startswith("prepare") else "prepare_ssd"


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("name", list(CASES))
def test_fuzzed_inputs_never_crash_2000_cases_per_command(name):
    strategy, case = CASES[name]
    properties = sum(1 for n in CASES if _command(n) == _command(name))
    fuzz(strategy, -(-SLOW_EXAMPLES_PER_COMMAND // properties))(case)()


def test_slow_suite_gives_each_command_2000_cases():
    per_command = {}
    for n in CASES:
        properties = sum(1 for m in CASES if _command(m) == _command(n))
        per_command[_command(n)] = per_command.get(_command(n), 0) + -(-SLOW_EXAMPLES_PER_COMMAND // properties)
    assert per_command == {"plan": 2000, "prepare_ssd": 2000, "train": 2000}
