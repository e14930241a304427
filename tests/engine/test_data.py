"""The data path: chat templates and loss masks, the tokenized cache, memory-mapped batches, the order."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("transformers")

from memascend_engine import data as D  # noqa: E402
from memascend_engine import data_prepare as P  # noqa: E402
from memascend_engine import data_records as R  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZER_JSON = os.path.join(REPO, "presets", "train", "data", "tokenizer.json")
TINY_ALPACA = os.path.join(REPO, "presets", "train", "data", "tiny-alpaca.jsonl")
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Reverse: abc"},
        {"role": "assistant", "content": "cba"}, {"role": "user", "content": "And xyz?"},
        {"role": "assistant", "content": "zyx"}]


@pytest.fixture(scope="module")
def tok():
    return P.load_tokenizer(TOKENIZER_JSON)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory, tok):
    """A tokenizer directory with its own chat template (ChatML), as a real instruct model ships it."""
    d = tmp_path_factory.mktemp("tok")
    t = P.load_tokenizer(TOKENIZER_JSON)
    t.chat_template = P.BUILTIN_TEMPLATES["chatml"]
    t.save_pretrained(d)
    return str(d)


def trained_text(tok, ids, mask) -> str:
    return tok.decode([i for i, m in zip(ids, mask) if m])


def test_only_assistant_turns_count_in_the_loss(tok_dir):
    t = P.load_tokenizer(tok_dir)
    name, template = P.resolve_template(t, None)
    assert name == "tokenizer" and "<|im_start|>" in template
    enc = P.Encoder(t, name, template)
    ids, mask = enc.encode_chat(CHAT, "x:1")
    assert len(ids) == len(mask)
    assert trained_text(t, ids, mask) == "cba<|im_end|>\nzyx<|im_end|>\n"
    # Everything else - system, user turns, role headers - is context only.
    assert t.decode(ids) == t.apply_chat_template(CHAT, tokenize=False)


def test_template_override_and_plain_template_appends_eos(tok):
    name, template = P.resolve_template(tok, "plain")
    enc = P.Encoder(tok, name, template)
    ids, mask = enc.encode_chat([{"role": "user", "content": "Add.\n3 + 4"}, {"role": "assistant", "content": "7"}], "x")
    assert tok.decode(ids) == "Add.\n3 + 4\n7<|end|>"
    assert ids[-1] == tok.eos_token_id and trained_text(tok, ids, mask) == "7<|end|>"


def test_text_format_uses_the_tokenizers_special_tokens_and_eos(tok):
    enc = P.Encoder(tok, "none", None)
    ids, mask = enc.encode_text("hello world")
    assert ids[-1] == tok.eos_token_id and all(mask) and tok.decode(ids[:-1]) == "hello world"


def test_chat_data_without_any_template_is_refused(tok):
    enc = P.Encoder(tok, *P.resolve_template(tok, None))
    with pytest.raises(D.DataError, match="set `template:`"):
        enc.encode_chat(CHAT, "f.jsonl:3")


def test_template_that_rewrites_earlier_turns_is_refused(tok):
    # Renders only the last exchange: adding a turn changes what came before.
    odd = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}>{% endif %}"
    enc = P.Encoder(tok, "odd", odd)
    with pytest.raises(D.DataError, match="turn by turn"):
        enc.encode_chat(CHAT, "f.jsonl:1")


def test_formats_map_to_messages():
    fmt = R.Format("alpaca")
    m = R.to_messages({"instruction": "Add.", "input": "1 + 2", "output": "3", "history": [["hi", "hello"]]}, "w", fmt)
    assert [x["role"] for x in m] == ["user", "assistant", "user", "assistant"] and m[2]["content"] == "Add.\n1 + 2"
    share = R.Format("sharegpt", columns={"messages": "conversations"})
    m = R.to_messages({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}],
                       "system": "s"}, "w", share)
    assert m == [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                 {"role": "assistant", "content": "a"}]
    openai = R.to_messages({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
                           "w", R.Format("sharegpt"))
    assert openai[-1] == {"role": "assistant", "content": "a"}
    with pytest.raises(D.DataError, match="w: conversation has no assistant turn"):
        R.to_messages({"messages": [{"role": "user", "content": "q"}]}, "w", R.Format("sharegpt"))
    with pytest.raises(D.DataError, match="w: record needs a non-empty string 'output'"):
        R.to_messages({"instruction": "x"}, "w", fmt)


def spec(path, **kw):
    base = dict(paths=[path], format="alpaca", packing=True, seq_len=64, validation_split=0.05, seed=0)
    return P.PrepSpec(**{**base, **kw})


def build(tok, tmp_path, **kw):
    name, template = P.resolve_template(tok, "plain")
    return P.build_cache(spec(kw.pop("path", TINY_ALPACA), **kw), tok, name, template, cache_root=str(tmp_path))


def test_cache_is_built_once_and_keyed_by_every_input(tok, tmp_path):
    folder, meta = build(tok, tmp_path)
    assert meta["samples"] == 400 and meta["splits"]["validation"]["samples"] == 20  # round(0.05 x 400)
    train = meta["splits"]["train"]
    assert train["rows"] == train["tokens"] // 64 and train["loss_tokens"] < train["tokens"]
    stamp = os.stat(os.path.join(folder, "train.tokens")).st_mtime_ns
    again, _ = build(tok, tmp_path)
    assert again == folder and os.stat(os.path.join(folder, "train.tokens")).st_mtime_ns == stamp
    other, _ = build(tok, tmp_path, seq_len=32)
    assert other != folder
    assert sorted(n for n in os.listdir(tmp_path) if ".tmp" in n) == []  # no half-written caches left


def test_batches_from_the_memory_map(tok, tmp_path):
    folder, meta = build(tok, tmp_path)
    cache = D.TokenCache(folder)
    b = cache.train.batch([0, 3])
    assert b["input_ids"].shape == (2, 64) and "attention_mask" not in b
    tokens = np.fromfile(os.path.join(folder, "train.tokens"), dtype=meta["token_dtype"])
    mask = np.fromfile(os.path.join(folder, "train.mask"), dtype=np.uint8)
    assert (b["input_ids"][1] == tokens[192:256]).all()
    assert ((b["labels"][1] == -100) == (mask[192:256] == 0)).all()


def test_padding_mode_rows_are_samples_padded_to_the_longest_in_the_batch(tok, tmp_path):
    folder, meta = build(tok, tmp_path, packing=False, seq_len=16)
    split = D.TokenCache(folder).train
    assert len(split) == meta["splits"]["train"]["samples"] > 300
    b = split.batch([0, 1, 2])
    n = b["attention_mask"].sum(axis=1)
    assert b["input_ids"].shape[1] == n.max() <= 16
    assert (b["labels"][b["attention_mask"] == 0] == -100).all()
    assert (b["input_ids"][b["attention_mask"] == 0] == tok.pad_token_id).all()


def test_jsonl_json_and_parquet_give_the_same_tokens(tok, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    records = [json.loads(l) for l in open(TINY_ALPACA)]
    as_json = tmp_path / "d.json"
    as_json.write_text(json.dumps(records))
    as_parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(records), as_parquet)
    caches = [build(tok, tmp_path / n, path=str(p))[0] for n, p in
              (("a", TINY_ALPACA), ("b", as_json), ("c", as_parquet))]
    blobs = [open(os.path.join(c, "train.tokens"), "rb").read() for c in caches]
    assert blobs[0] == blobs[1] == blobs[2]


def test_bad_records_name_file_and_line(tok, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "a", "output": "b"}\n{"instruction": "a", "output": \n')
    with pytest.raises(D.DataError, match="bad.jsonl:2: not valid JSON"):
        build(tok, tmp_path, path=str(bad))
    gap = tmp_path / "gap.jsonl"
    gap.write_text('{"instruction": "a", "output": "b"}\n\n{"instruction": "a", "output": "b"}\n')
    with pytest.raises(D.DataError, match="gap.jsonl:2: empty line"):
        build(tok, tmp_path, path=str(gap))


@pytest.mark.parametrize("n", [1, 2, 3, 17, 64, 1000, 4099])
def test_permute_is_a_permutation(n):
    seen = [D.permute(i, n, seed=7) for i in range(n)]
    assert sorted(seen) == list(range(n))
    if n > 16:
        assert seen != list(range(n)) and seen != [D.permute(i, n, seed=8) for i in range(n)]


def test_micro_batches_split_across_ranks_and_replay_per_epoch():
    rows = [D.micro_batch_rows(10, 3, k, micro_batch=2, world_size=2, rank=r) for k in range(2) for r in range(2)]
    flat = [x for r in rows for x in r]
    assert len(set(flat)) == 8  # 2 global micro-batches of 4 distinct rows; the 2-row tail is skipped
    assert D.micro_batch_rows(10, 3, 2, micro_batch=2, world_size=2, rank=0) == \
        [D.epoch_row(p, 10, 3, 1) for p in (0, 1)]  # micro-batch 2 starts epoch 1
