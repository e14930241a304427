"""Root Typer app: explicit registration of one thin module per command, one error handler.

Nothing here (or in any command module at import time) imports torch or deepspeed: `--help`,
`inspect` and `plan` must start in well under a second.
"""

from __future__ import annotations

import sys

import typer

from memascend_cli import __version__
from memascend_cli.commands import inspect as inspect_cmd
from memascend_cli.commands import plan as plan_cmd
from memascend_cli.errors import EXIT_BAD_INPUT, EXIT_CODES_HELP, MemascendError

app = typer.Typer(
    name="memascend",
    help=(
        "Fine-tune LLMs with DeepSpeed ZeRO-Infinity (params + optimizer on NVMe) using far less "
        "system memory.\n\nStart with `memascend inspect`, then `memascend plan --model qwen2.5-7b`."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode="markdown",
    epilog=EXIT_CODES_HELP,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"memascend {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """memascend root options."""


# Registration is explicit: one module per command, in the order `--help` lists them.
app.command("inspect", epilog=EXIT_CODES_HELP)(inspect_cmd.inspect_command)
app.command("plan", epilog=EXIT_CODES_HELP)(plan_cmd.plan_command)


def _register_optional() -> None:
    # Commands added by later modules register themselves only if present, keeping this file the
    # single place that lists them.
    import importlib

    for module_name, command_name, func_name in (
        ("memascend_cli.commands.prepare_ssd", "prepare-ssd", "prepare_ssd_command"),
        ("memascend_cli.commands.train", "train", "train_command"),
        ("memascend_cli.commands.launch", "launch", "launch_command"),
        ("memascend_cli.commands.bench", "bench", "bench_command"),
        ("memascend_cli.commands.export", "export", "export_command"),
        ("memascend_cli.commands.import_gguf", "import-gguf", "import_gguf_command"),
    ):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        app.command(command_name, epilog=EXIT_CODES_HELP)(getattr(module, func_name))


_register_optional()


def one_line(text: str) -> str:
    """`text` as one terminal line: control characters and line separators (a newline in a user's file name)
    written as escapes."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in str(text))


def _fail(message: str, hint: str | None, code: int) -> None:
    """Print `error: message` and `hint: hint` (one line each, never parsed as markup) and exit with `code`."""
    from rich.markup import escape

    from memascend_cli.console import err

    # Messages quote other programs' text (gloo's "[.../pair.cc:537]"): never parse it as markup.
    err.print(f"[red]error:[/red] {escape(one_line(message))}", markup=True, highlight=False, soft_wrap=True)
    if hint:
        err.print(f"[cyan]hint:[/cyan] {escape(one_line(hint))}", markup=True, highlight=False, soft_wrap=True)
    sys.exit(code)


def _usage_error(exc) -> None:
    """Click's usage errors (bad option value, unknown option, missing argument) as one `error:` line, exit 2."""
    if getattr(exc, "ctx", None) is None or exc.ctx.command.name == app.info.name:
        hint = "see `memascend --help`"
    else:
        hint = f"see `{exc.ctx.command_path} --help`"
    _fail(" ".join(exc.format_message().split()), hint, EXIT_BAD_INPUT)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app, turn expected errors into `error:`/`hint:` lines."""
    try:
        code = app(args=argv, prog_name="memascend", standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except typer.TyperException as exc:  # Click's errors (Typer's own copy of Click derives them from this)
        if type(exc).__name__ == "NoArgsIsHelpError" and getattr(exc, "ctx", None) is not None:
            # `memascend` alone: the help text, as Click prints it.
            typer.echo(exc.ctx.get_help(), err=True)
            sys.exit(EXIT_BAD_INPUT)
        _usage_error(exc)
    except typer.Abort:
        sys.exit(130)
    except MemascendError as exc:
        _fail(exc.message, exc.hint, exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError) as exc:
        # OS errors on user-given paths are input problems, not bugs.
        _fail(str(exc), "check the path and its permissions", EXIT_BAD_INPUT)
