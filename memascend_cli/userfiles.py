"""Reading files a user wrote (model specs, config.json, hardware profiles): an unreadable or malformed file is one
`error:` line (BadInput), never a traceback. Stdlib + PyYAML."""

from __future__ import annotations

import json
import os
from typing import Any

from memascend_cli.errors import BadInput


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def load_json(path: str, *, hint: str = "check the file") -> Any:
    """The parsed file; BadInput if it cannot be read or is not strict JSON (NaN and Infinity are not JSON)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})", hint) from None
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise BadInput(f"{path}: not valid JSON ({_first_line(exc)})", hint) from None
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}", hint) from None


def load_yaml(path: str, *, hint: str = "fix the syntax; every line is `key: value`") -> Any:
    """The parsed file (safe_load); BadInput if it cannot be read or is not valid YAML."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise BadInput(f"{path}: not valid YAML{where} ({_first_line(getattr(exc, 'problem', None) or exc)})",
                       hint) from None
    except (ValueError, RecursionError) as exc:  # bytes that are not UTF-8; absurdly deep nesting
        raise BadInput(f"{path}: not valid YAML ({_first_line(exc)})", hint) from None
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}", hint) from None


def _first_line(exc) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def looks_like_path(text: str) -> bool:
    """A recipe value that names a file rather than a preset or template name."""
    return text.startswith((".", "/", "~")) or os.sep in text or text.endswith((".gguf", ".jinja", ".json"))
