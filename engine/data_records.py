"""Dataset records: local JSONL / JSON / Parquet / .txt files (and the Arrow files `datasets` caches hub datasets in)
read record by record, and each record turned into a conversation (alpaca, sharegpt, OpenAI messages; LLaMA-Factory's
dataset_info columns and tags) or a text.

Errors name the file and line (`file:line: what`, data.DataError).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Iterator

from memascend_engine.data import DataError


# --- reading records ----------------------------------------------------------------------------


def _iter_file(path: str) -> Iterator[tuple[object, str]]:
    """(record, 'file:line') pairs from JSONL, a JSON list, Parquet, or a .txt file (one sample per line)."""
    name = os.path.basename(path)
    if path.endswith(".arrow"):
        # A hub dataset as `datasets` caches it (engine/hub_data.py): Arrow IPC stream files, memory-mapped.
        import pyarrow as pa

        row = 0
        with pa.memory_map(path) as source:
            for batch in pa.ipc.open_stream(source):
                for rec in batch.to_pylist():
                    row += 1
                    yield rec, f"{name}:row {row}"
        return
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DataError(f"{name}: reading Parquet needs pyarrow (pip install pyarrow)") from None
        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise DataError(f"{name}: not a Parquet file ({str(exc).splitlines()[0]})") from None
        row = 0
        for batch in pf.iter_batches(batch_size=1024):
            for rec in batch.to_pylist():
                row += 1
                yield rec, f"{name}:row {row}"
        return
    try:
        f = open(path, encoding="utf-8")
    except OSError as exc:
        raise DataError(f"{path}: cannot open ({exc.strerror})") from None
    with f:
        try:
            if path.endswith(".txt"):
                for i, line in enumerate(f, 1):
                    if line.strip():  # blank lines separate paragraphs in plain text
                        yield {"text": line.rstrip("\n")}, f"{name}:{i}"
                return
            head = f.read(4096)
            f.seek(0)
            if path.endswith(".json") or head.lstrip().startswith("["):
                # A JSON list is parsed whole (in the preparing process only; the ranks never see it).
                try:
                    data = json.load(f)
                except json.JSONDecodeError as exc:
                    raise DataError(f"{name}:{exc.lineno}: not valid JSON ({exc.msg})") from None
                if not isinstance(data, list):
                    raise DataError(f"{name}: expected a JSON list of records")
                for i, r in enumerate(data):
                    yield r, f"{name}:record {i + 1}"
                return
            for i, line in enumerate(f, 1):
                if not line.strip():
                    raise DataError(f"{name}:{i}: empty line")
                try:
                    yield json.loads(line), f"{name}:{i}"
                except json.JSONDecodeError as exc:
                    raise DataError(f"{name}:{i}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def iter_records(paths: list[str], max_samples: int | None = None) -> Iterator[tuple[object, str]]:
    for path in paths:
        if not os.path.isfile(path):
            raise DataError(f"dataset file {path} does not exist")
        for n, item in enumerate(_iter_file(path)):
            if max_samples is not None and n >= max_samples:
                break
            yield item


def count_records(paths: list[str], max_samples: int | None = None) -> int:
    """Records of the files (a first, cheap pass: the validation split needs the total)."""
    total = 0
    for path in paths:
        if not os.path.isfile(path):
            raise DataError(f"dataset file {path} does not exist")
        n = None
        if path.endswith(".arrow"):
            import pyarrow as pa

            with pa.memory_map(path) as source:
                n = sum(batch.num_rows for batch in pa.ipc.open_stream(source))
        elif path.endswith(".parquet"):
            try:
                import pyarrow.parquet as pq

                n = pq.ParquetFile(path).metadata.num_rows
            except Exception:  # noqa: BLE001 - the reading pass below reports the real error
                n = None
        if n is None:
            n = sum(1 for _ in _iter_file(path))
        total += min(n, max_samples) if max_samples is not None else n
    return total


# --- records -> conversations or text --------------------------------------------------------------

# Tool results are "tool" turns and function calls assistant turns with `tool_calls`, as chat templates expect them
# (LLaMA-Factory's observation / function_call roles); a template renders them with the record's `tools` schemas.
_FUNCTION_CALL = "function_call"
_SHAREGPT_ROLES = {"human": "user", "user": "user", "system": "system", "gpt": "assistant", "assistant": "assistant",
                   "observation": "tool", "function_call": _FUNCTION_CALL, "tool": "tool"}


@dataclass
class Format:
    """How records map to messages (LLaMA-Factory's dataset_info columns and tags)."""

    kind: str
    columns: dict = field(default_factory=dict)
    tags: dict = field(default_factory=dict)
    text_field: str = "text"


def _str(rec: dict, key: str, where: str, *, required: bool) -> str:
    v = rec.get(key)
    if v is None or v == "":
        if required:
            raise DataError(f"{where}: record needs a non-empty string {key!r}")
        return ""
    if not isinstance(v, str):
        raise DataError(f"{where}: {key!r} must be a string")
    return v


def to_messages(rec, where: str, fmt: Format) -> list[dict]:
    """[{role, content}] of one alpaca or sharegpt/OpenAI record."""
    if not isinstance(rec, dict):
        raise DataError(f"{where}: expected an object (a JSON record)")
    c = fmt.columns
    if fmt.kind == "alpaca":
        instruction = _str(rec, c.get("prompt", "instruction"), where, required=True)
        query = _str(rec, c.get("query", "input"), where, required=False)
        response = _str(rec, c.get("response", "output"), where, required=True)
        system = _str(rec, c.get("system", "system"), where, required=False)
        msgs = [{"role": "system", "content": system}] if system else []
        history = rec.get(c.get("history", "history")) or []
        if not isinstance(history, list):
            raise DataError(f"{where}: 'history' must be a list of [question, answer] pairs")
        for pair in history:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
                raise DataError(f"{where}: 'history' must be a list of [question, answer] pairs")
            msgs += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
        # LLaMA-Factory's alpaca convention: the input follows the instruction on a new line.
        msgs += [{"role": "user", "content": instruction + ("\n" + query if query else "")},
                 {"role": "assistant", "content": response}]
        return msgs
    # sharegpt: {conversations: [{from, value}]}, or OpenAI-style {messages: [{role, content}]}.
    key = c.get("messages")
    if key is None:
        key = "conversations" if "conversations" in rec or "messages" not in rec else "messages"
    openai = key == "messages" and not fmt.tags
    role_tag = fmt.tags.get("role_tag", "role" if openai else "from")
    content_tag = fmt.tags.get("content_tag", "content" if openai else "value")
    roles = dict(_SHAREGPT_ROLES)
    for tag, role in (("user_tag", "user"), ("assistant_tag", "assistant"), ("system_tag", "system"),
                      ("observation_tag", "tool"), ("function_tag", _FUNCTION_CALL)):
        if tag in fmt.tags:
            roles[fmt.tags[tag]] = role
    conv = rec.get(key)
    if not isinstance(conv, list) or not conv:
        raise DataError(f"{where}: sharegpt record needs a non-empty {key!r} list")
    msgs = []
    system = rec.get(c.get("system", "system"))
    if isinstance(system, str) and system:
        msgs.append({"role": "system", "content": system})
    for j, turn in enumerate(conv):
        if not isinstance(turn, dict) or not isinstance(turn.get(content_tag), str) or turn.get(role_tag) not in roles:
            raise DataError(f"{where}: {key}[{j}] needs {role_tag!r} ({'/'.join(sorted(roles))}) and a string "
                            f"{content_tag!r}")
        role = roles[turn[role_tag]]
        msgs.append(_tool_call(turn[content_tag], f"{where}: {key}[{j}]") if role == _FUNCTION_CALL
                    else {"role": role, "content": turn[content_tag]})
    if not any(m["role"] == "assistant" for m in msgs):
        raise DataError(f"{where}: conversation has no assistant turn to learn from")
    return msgs


def _tool_call(content: str, where: str) -> dict:
    """An assistant turn calling tools, from LLaMA-Factory's function_call content: JSON {name, arguments} or a list
    of them."""
    try:
        calls = json.loads(content)
    except ValueError:
        calls = None
    calls = calls if isinstance(calls, list) else [calls]
    if not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls):
        raise DataError(f"{where}: a function_call turn must be JSON {{\"name\": ..., \"arguments\": ...}} (or a list "
                        "of them)")
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": c["name"], "arguments": c.get("arguments", {})}}
                           for c in calls]}


def record_tools(rec, where: str, fmt: Format) -> list | None:
    """The record's tool schemas (dataset_info's `tools` column: a JSON string or a list), or None."""
    key = fmt.columns.get("tools")
    value = rec.get(key) if key and isinstance(rec, dict) else None
    if value in (None, "", "[]"):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise DataError(f"{where}: {key!r} must hold the tools' JSON schemas") from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise DataError(f"{where}: {key!r} must hold the tools' JSON schemas (a list of objects)")
    return value or None


def to_text(rec, where: str, fmt: Format) -> str:
    key = fmt.columns.get("prompt", fmt.text_field) if fmt.columns else fmt.text_field
    value = rec.get(key) if isinstance(rec, dict) else None
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: text record needs a non-empty string {key!r}")
    return value
