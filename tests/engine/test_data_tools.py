"""Tool-calling data (LLaMA-Factory's `tools` column, function_call / observation turns) never loses its meaning:
rendered through a chat template that shows the tools, calls and results, or refused with the reason."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from memascend_engine import data as D  # noqa: E402
from memascend_engine import data_prepare as P  # noqa: E402
from memascend_engine import data_records as R  # noqa: E402
from tests.engine.test_data import TOKENIZER_JSON, trained_text  # noqa: E402

# A ChatML template with tools, after Qwen2.5's (tools in the system turn, <tool_call> / <tool_response> blocks).
TOOLS_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\n# Tools\\n' }}{%- for t in tools %}{{ t | tojson + '\\n' }}{%- endfor %}"
    "{{ '<|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif m.tool_calls %}{{ '<|im_start|>assistant\\n' }}{%- for c in m.tool_calls %}"
    "{{ '<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' + c.function.arguments | tojson"
    " + '}\\n</tool_call>' }}{%- endfor %}{{ '<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")

TOOLS = [{"type": "function", "function": {"name": "get_time", "description": "Current time",
                                            "parameters": {"type": "object", "properties": {}}}}]
# A glaive_toolcall_en_demo-shaped record (sharegpt, columns messages=conversations, tools=tools).
RECORD = {"conversations": [
    {"from": "human", "value": "What time is it?"},
    {"from": "function_call", "value": json.dumps({"name": "get_time", "arguments": {}})},
    {"from": "observation", "value": json.dumps({"time": "10:00"})},
    {"from": "gpt", "value": "It is 10:00."}],
    "tools": json.dumps(TOOLS)}
FMT = R.Format("sharegpt", {"messages": "conversations", "tools": "tools"})


@pytest.fixture(scope="module")
def tok():
    return P.load_tokenizer(TOKENIZER_JSON)


def test_tools_calls_and_results_are_rendered_and_only_calls_and_answers_trained(tok):
    msgs = R.to_messages(RECORD, "x:1", FMT)
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert msgs[1]["tool_calls"][0]["function"] == {"name": "get_time", "arguments": {}}
    tools = R.record_tools(RECORD, "x:1", FMT)
    assert tools == TOOLS
    enc = P.Encoder(tok, "tools", TOOLS_TEMPLATE)
    ids, mask = enc.encode_chat(msgs, "x:1", tools)
    text = tok.decode(ids)
    assert '"name": "get_time"' in text and "# Tools" in text and "<tool_response>" in text
    trained = trained_text(tok, ids, mask)
    assert "<tool_call>" in trained and "It is 10:00." in trained
    assert "tool_response" not in trained and "What time" not in trained


def test_a_template_without_tools_is_refused_with_the_reason(tok):
    msgs = R.to_messages(RECORD, "x:1", FMT)
    enc = P.Encoder(tok, "chatml", P.BUILTIN_TEMPLATES["chatml"])
    with pytest.raises(D.DataError, match="does not render the record's tools"):
        enc.encode_chat(msgs, "x:1", R.record_tools(RECORD, "x:1", FMT))
    # Without the schemas, the call itself would still be lost.
    with pytest.raises(D.DataError, match="drops tool calls or tool results \\('get_time'\\)"):
        enc.encode_chat(msgs, "x:1", None)


def test_bad_function_call_and_tools_are_named(tok):
    bad = {**RECORD, "conversations": [RECORD["conversations"][0], {"from": "function_call", "value": "get_time()"},
                                       RECORD["conversations"][3]]}
    with pytest.raises(D.DataError, match=r"conversations\[1\]: a function_call turn must be JSON"):
        R.to_messages(bad, "x:1", FMT)
    with pytest.raises(D.DataError, match="'tools' must hold the tools' JSON schemas"):
        R.record_tools({**RECORD, "tools": "not json"}, "x:1", FMT)
    assert R.record_tools({**RECORD, "tools": "[]"}, "x:1", FMT) is None


def test_every_dropped_sample_is_counted_with_its_reason(tok, tmp_path):
    from tests.engine.test_data import build

    # seq_len 4 without packing: the instruction alone fills the row, so no answer token is left to learn.
    _, meta = build(tok, tmp_path, packing=False, seq_len=4, validation_split=0.0)
    train = meta["splits"]["train"]
    assert train["dropped_samples"] > 0
    assert train["dropped_reasons"] == {"no trained token in the first 4 tokens (seq_len)": train["dropped_samples"]}
    assert train["samples"] + train["dropped_samples"] == meta["samples"]
