"""The options plan, bench and train share: each flag set that two of them have is one declaration (memascend_cli/
options.py), with the same short form, help text and default wherever it appears, and each command's set frozen."""

from __future__ import annotations

import pytest
import typer

from memascend_cli.app import app
from memascend_cli.defaults import DEFAULT_SEQ_LEN

COMMANDS = ("plan", "bench", "train")
SHARED = {
    "plan": {"--model", "--seq-len", "--micro-batch", "--grad-accum", "--dtype", "--checkpointing", "--host-budget",
             "--ranks", "--dram-cap", "--cpu-gflops", "--engine", "--json", "--placement"},
    "bench": {"--model", "--seq-len", "--micro-batch", "--grad-accum", "--dtype", "--checkpointing", "--host-budget",
              "--ranks", "--dram-cap", "--cpu-gflops", "--steps", "--region", "--resume", "--json", "--placement"},
    "train": {"--model", "--seq-len", "--micro-batch", "--dram-cap", "--steps", "--region", "--resume", "--engine",
              "--placement"},
}
"""Which shared options each command has: a flag added to or dropped from a command changes this on purpose."""


def _options(command: str) -> dict:
    """{long flag: the click option} of one command."""
    params = typer.main.get_command(app).commands[command].params
    return {o: p for p in params for o in p.opts if o.startswith("--")}


def _declared(p) -> tuple:
    return tuple(p.opts), tuple(p.secondary_opts), p.help, p.default, p.show_default, p.rich_help_panel is not None


def test_every_flag_two_commands_have_is_one_declaration():
    options = {c: _options(c) for c in COMMANDS}
    found = {c: {f for f in options[c] if any(f in options[d] for d in COMMANDS if d != c)} for c in COMMANDS}
    assert found == SHARED
    for flag in set().union(*SHARED.values()):
        having = [c for c in COMMANDS if flag in options[c]]
        declared = {c: _declared(options[c][flag]) for c in having}
        assert len(set(declared.values())) == 1, (flag, declared)


@pytest.mark.parametrize("command", COMMANDS)
def test_the_shared_job_options_name_one_default(command):
    """A shared option defaults to None (not given) in every command, and its help names the one default."""
    options = _options(command)
    seq = options["--seq-len"]
    assert seq.default is None and f"else {DEFAULT_SEQ_LEN}]" in seq.help and seq.opts == ["--seq-len", "-s"]
    assert options["--micro-batch"].opts == ["--micro-batch", "-b"] and options["--model"].opts == ["--model", "-m"]
    for flag in SHARED[command] - {"--engine", "--json", "--resume"}:
        assert options[flag].default is None, flag

