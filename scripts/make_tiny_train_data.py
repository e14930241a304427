"""Generate presets/train/data/tiny-alpaca.jsonl and its byte-level BPE tokenizer.json.

The samples are deterministic toy tasks (addition, copying, reversing, upper-casing) so that a
tiny random Llama's loss falls within a few dozen steps on a CPU. The tokenizer is trained on
exactly this data with the `tokenizers` package; its vocabulary (<= 1024) fits preset
tiny-llama's vocab_size of 1024.

Usage: python scripts/make_tiny_train_data.py [--out presets/train/data] [--samples 400]
"""

from __future__ import annotations

import argparse
import json
import os
import random

VOCAB_SIZE = 512
"""BPE vocabulary: 256 byte symbols + 3 specials + merges; well under tiny-llama's 1024."""
SPECIAL_TOKENS = ["<pad>", "<|begin|>", "<|end|>"]
WORDS = ["apple", "river", "stone", "cloud", "green", "tiger", "piano", "orbit", "maple", "delta", "lemon", "quartz"]


def samples(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            a, b = rng.randint(0, 49), rng.randint(0, 49)
            out.append({"instruction": "Add the two numbers.", "input": f"{a} + {b}", "output": str(a + b)})
        elif kind == 1:
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 4)))
            out.append({"instruction": "Repeat the text exactly.", "input": words, "output": words})
        elif kind == 2:
            word = rng.choice(WORDS)
            out.append({"instruction": "Reverse the word.", "input": word, "output": word[::-1]})
        else:
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))
            out.append({"instruction": "Write the text in capital letters.", "input": words, "output": words.upper()})
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "presets", "train", "data"))
    ap.add_argument("--samples", type=int, default=400)
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    os.makedirs(args.out, exist_ok=True)
    rows = samples(args.samples)
    data_path = os.path.join(args.out, "tiny-alpaca.jsonl")
    with open(data_path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    texts = [f"{r['instruction']}\n{r['input']}\n{r['output']}" for r in rows]
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(os.path.join(args.out, "tokenizer.json"))
    print(f"wrote {len(rows)} samples to {data_path}, vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
