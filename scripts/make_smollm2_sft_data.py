"""Generate presets/train/data/smol-instruct.jsonl: a small local instruct set in OpenAI `messages` form.

Every answer uses one fixed format, `Answer: <answer>.` - a format SmolLM2-135M-Instruct does not
use on its own (it answers in full sentences) - so a fine-tune that works is visible in the
generations of the export, not only in the loss. Tasks: capitals, arithmetic, opposites,
plurals, spelling, colours of things; deterministic from the seed.

Usage: python scripts/make_smollm2_sft_data.py [--out presets/train/data/smol-instruct.jsonl] [--samples 480]
"""

from __future__ import annotations

import argparse
import json
import random

CAPITALS = {"France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Portugal": "Lisbon",
            "Japan": "Tokyo", "China": "Beijing", "India": "New Delhi", "Canada": "Ottawa", "Egypt": "Cairo",
            "Kenya": "Nairobi", "Peru": "Lima", "Chile": "Santiago", "Norway": "Oslo", "Sweden": "Stockholm",
            "Finland": "Helsinki", "Poland": "Warsaw", "Greece": "Athens", "Turkey": "Ankara", "Russia": "Moscow",
            "Austria": "Vienna", "Ireland": "Dublin", "Mexico": "Mexico City", "Argentina": "Buenos Aires",
            "Thailand": "Bangkok", "Vietnam": "Hanoi", "Cuba": "Havana", "Denmark": "Copenhagen"}
OPPOSITES = {"hot": "cold", "big": "small", "fast": "slow", "happy": "sad", "light": "dark", "open": "closed",
             "early": "late", "strong": "weak", "full": "empty", "high": "low", "old": "young", "rich": "poor",
             "wet": "dry", "hard": "soft", "loud": "quiet", "first": "last"}
PLURALS = {"cat": "cats", "box": "boxes", "child": "children", "mouse": "mice", "city": "cities", "leaf": "leaves",
           "foot": "feet", "tooth": "teeth", "bus": "buses", "knife": "knives", "baby": "babies", "man": "men"}
COLOURS = {"the sky on a clear day": "blue", "fresh grass": "green", "snow": "white", "coal": "black",
           "a ripe banana": "yellow", "a ripe tomato": "red", "an orange": "orange", "a flamingo": "pink"}
WORDS = ["apple", "river", "stone", "cloud", "tiger", "piano", "orbit", "maple", "lemon", "garden", "window", "rocket"]


def sample(rng: random.Random, kind: int) -> tuple[str, str]:
    if kind == 0:
        country = rng.choice(sorted(CAPITALS))
        q = rng.choice(["What is the capital of {}?", "Name the capital city of {}.", "Which city is the capital of {}?"])
        return q.format(country), CAPITALS[country]
    if kind == 1:
        a, b = rng.randint(2, 60), rng.randint(2, 60)
        if rng.random() < 0.5:
            return rng.choice(["What is {} plus {}?", "Add {} and {}."]).format(a, b), str(a + b)
        a, b = max(a, b), min(a, b)
        return rng.choice(["What is {} minus {}?", "Subtract {1} from {0}."]).format(a, b), str(a - b)
    if kind == 2:
        w = rng.choice(sorted(OPPOSITES))
        return rng.choice(["What is the opposite of '{}'?", "Give the opposite of the word {}."]).format(w), OPPOSITES[w]
    if kind == 3:
        w = rng.choice(sorted(PLURALS))
        return rng.choice(["What is the plural of '{}'?", "Write the plural form of {}."]).format(w), PLURALS[w]
    if kind == 4:
        w = rng.choice(WORDS)
        return rng.choice(["Spell the word '{}' backwards.", "Reverse the letters of {}."]).format(w), w[::-1]
    thing = rng.choice(sorted(COLOURS))
    return rng.choice(["What colour is {}?", "Which colour does {} have?"]).format(thing), COLOURS[thing]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="presets/train/data/smol-instruct.jsonl")
    ap.add_argument("--samples", type=int, default=480)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with open(args.out, "w", encoding="utf-8") as f:
        for i in range(args.samples):
            question, answer = sample(rng, i % 6)
            rec = {"messages": [{"role": "user", "content": question},
                                {"role": "assistant", "content": f"Answer: {answer}."}]}
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
