"""A prompt set for on-policy data: chat prompts a target answers, no download needed.

    python -m dflash.data.prompt_gen --n 400 --out prompts.jsonl [--seed 0]

Five kinds, drawn in turn, each from templates filled with seeded choices: arithmetic
word problems (with the answer, so replies can be checked), rewriting a sentence,
listing items, short explanations, and small code tasks. Each line is a prompt-only
conversation ({"id", "kind", "messages": [{"role": "user", ...}], "answer"?}), which
`dflash.regenerate` answers with the target (its reply becomes the final turn).
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun"]
ITEMS = ["apples", "books", "pencils", "stamps", "marbles", "cookies", "tickets", "shells"]
TOPICS = ["why the sky is blue", "how a bicycle stays upright", "what a prime number is",
          "how vaccines work", "why ice floats", "what inflation is", "how rainbows form",
          "what a hash table is", "why leaves change colour", "how a compiler works"]
SENTENCES = ["the meeting was moved to friday because the room was booked",
             "our team finished the project early and under budget",
             "the train was late so we missed the first half of the film",
             "she fixed the bug after reading the logs for an hour"]
STYLES = ["more formal", "shorter", "friendlier", "in the passive voice", "as a question"]
LISTS = ["fruits that are red", "countries in South America", "ways to save energy at home",
         "programming languages", "musical instruments", "tips for a job interview"]
CODE = ["reverses a string", "checks whether a number is prime", "returns the largest of a "
        "list of numbers", "counts the vowels in a string", "computes the factorial of n",
        "merges two sorted lists"]
LANGS = ["Python", "JavaScript", "C", "Rust"]


def _arithmetic(r: random.Random) -> tuple[str, str]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    a, b, c = r.randint(3, 60), r.randint(2, 30), r.randint(2, 9)
    kind = r.randrange(3)
    if kind == 0:
        text = (f"{name} has {a} {item} and buys {b} more. Then {name} gives away {c}. "
                f"How many {item} does {name} have now?")
        return text, str(a + b - c)
    if kind == 1:
        text = f"{name} packs {item} into {c} boxes with {b} in each box. How many {item} is that?"
        return text, str(b * c)
    total = b * c
    text = f"{name} shares {total} {item} equally among {c} friends. How many does each get?"
    return text, str(b)


def make_prompt(i: int, seed: int) -> dict:
    """Prompt i of the set (deterministic in (i, seed))."""
    r = random.Random(seed * 1_000_003 + i)
    kind = ("arithmetic", "rewrite", "list", "explain", "code")[i % 5]
    answer = None
    if kind == "arithmetic":
        text, answer = _arithmetic(r)
        text += " Explain your steps, then give the final answer."
    elif kind == "rewrite":
        text = f"Rewrite this sentence {r.choice(STYLES)}: \"{r.choice(SENTENCES).capitalize()}.\""
    elif kind == "list":
        text = f"List {r.randint(3, 8)} {r.choice(LISTS)}, one per line."
    elif kind == "explain":
        text = f"Explain {r.choice(TOPICS)} in {r.randint(2, 4)} sentences."
    else:
        text = f"Write a {r.choice(LANGS)} function that {r.choice(CODE)}."
    rec = {"id": f"{kind}-{i}", "kind": kind, "messages": [{"role": "user", "content": text}]}
    if answer is not None:
        rec["answer"] = answer
    return rec


def write_prompts(n: int, out: str | Path, seed: int = 0) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(make_prompt(i, seed)) + "\n" for i in range(int(n))))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error("--n must be at least 1")
    print(write_prompts(args.n, args.out, args.seed))


if __name__ == "__main__":
    main()
