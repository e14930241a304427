"""Generate an instruct set of real English text, offline: the Python reference's help topics (pydoc_data.topics,
shipped with CPython, ~465 KB of prose and examples) in OpenAI `messages` form.

Each topic is cut at paragraph boundaries into answers of at most --chars characters; the question names the topic
and the part. Unlike presets/train/data/smol-instruct.jsonl (six templated tasks a 135M model learns in a few dozen
steps) the answers are text the model has to predict, so gradient norms, clipping and the loss curve over hundreds
of steps are those of a fine-tune on real text (the overlap's commit rate and the moments' quality check in
docs/results/ssd.md).

Usage: python scripts/make_pydoc_sft_data.py --out /var/tmp/pydoc-sft.jsonl [--chars 600]
"""

from __future__ import annotations

import argparse
import json
import platform


def parts(text: str, chars: int) -> list[str]:
    """`text` cut at blank lines into pieces of at most `chars` characters (a longer paragraph is one piece). Pure."""
    out: list[str] = []
    for para in (p.strip() for p in text.split("\n\n")):
        if not para:
            continue
        if out and len(out[-1]) + 2 + len(para) <= chars:
            out[-1] += "\n\n" + para
        else:
            out.append(para)
    return out


def records(topics: dict[str, str], chars: int) -> list[dict]:
    """One `messages` record per part of every topic, topics in name order. Pure."""
    recs = []
    for name in sorted(topics):
        ps = parts(topics[name], chars)
        for k, text in enumerate(ps, 1):
            question = f"From the Python reference, topic '{name}': write part {k} of {len(ps)}."
            recs.append({"messages": [{"role": "user", "content": question},
                                      {"role": "assistant", "content": text}]})
    return recs


def main() -> None:
    from pydoc_data.topics import topics

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--chars", type=int, default=600, help="longest answer, in characters (default 600)")
    args = ap.parse_args()
    recs = records(topics, args.chars)
    with open(args.out, "w", encoding="utf-8") as f:
        for rec in recs:
            f.write(json.dumps(rec) + "\n")
    print(f"{args.out}: {len(recs)} records from {len(topics)} topics of Python {platform.python_version()}")


if __name__ == "__main__":
    main()
