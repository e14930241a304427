"""docs/cli.md is every command's `--help` as the commands print it today (scripts/cli_doc.py), never typed by hand."""

import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMANDS = ("inspect", "plan", "prepare-ssd", "train", "launch", "bench", "export", "import-gguf")


def _cli_doc():
    spec = importlib.util.spec_from_file_location("cli_doc", os.path.join(REPO, "scripts", "cli_doc.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cli_md_is_what_every_commands_help_prints():
    cli_doc = _cli_doc()
    text = cli_doc.render()
    with open(cli_doc.OUT) as f:
        assert f.read() == text, "docs/cli.md is stale: run `python scripts/cli_doc.py`"
    # The app registers a command only if its module imports: a command that failed to register would be
    # missing from both the page and `--help`, and the comparison above would still pass.
    for name in COMMANDS:
        assert f"## memascend {name}\n" in text and f"Usage: memascend {name} [OPTIONS]" in text, name
