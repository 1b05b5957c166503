"""A prompt set for on-policy data: chat prompts a target answers, no download needed.

    python -m dflash.recipe.prompt_gen --n 400 --out prompts.jsonl [--seed 0] [--split train]

Five kinds, drawn in turn, each from templates filled with seeded choices: arithmetic
word problems (with the answer, so replies can be checked), rewriting a sentence,
listing items, short explanations, and small code tasks. Each line is a prompt-only
conversation ({"id", "kind", "messages": [{"role": "user", ...}], "answer"?}), which
`dflash.regenerate` answers with the target (its reply becomes the final turn).

Every prompt of a set is distinct (a repeated prompt is a repeated greedy reply: time
spent generating it again, and a training set that teaches one reply twice). A kind
whose templates run out (a few hundred prompts each) gives its turn to arithmetic,
whose numbers do not run out.

Subjects come from `prompt_words`, most composed from parts, so a thousand prompts
rarely ask about one subject twice. `split`: every fifth entry of each part (sentence,
who, deed, goal, country, topic, device, code task, name, item, ...) is held out;
`split="train"` draws from the other four fifths only, `split="heldout"` from the
held-out fifth only, so held-out prompts ask about subjects
no training prompt mentions (a prompt that differs from a training one only in its
count or audience gets a reply that shares whole sentences with that prompt's: it
measures recall of the training replies, not drafting). `all`: every subject.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from dflash.recipe import prompt_words as W
from dflash.errors import DataError, user_errors_exit

KINDS = ("arithmetic", "rewrite", "list", "explain", "code")
AUDIENCES = ["", " to a ten-year-old", " to a first-year university student"]
STYLES = ["more formal", "shorter", "friendlier", "in the passive voice", "as a question",
          "more politely", "for a newspaper headline", "in simpler words",
          "more enthusiastic", "in the future tense"]
LANGS = ["Python", "JavaScript", "C", "Rust", "Go", "Java"]
CODE_ASKS = ["", " Add a short comment explaining it.", " Include one example call."]
SPLITS = ("all", "train", "heldout")
PARTS = ("names", "items", "sentences", "lists", "topics", "code", "who", "did", "when",
         "goals", "people", "countries", "devices", "concepts", "stats", "props", "units")


def subjects(split: str) -> dict:
    """Each subject part (`prompt_words`) as `split` sees it: every fifth entry (index 4,
    9, ...) is held out. A composed subject takes every part from one split, so a
    held-out one is made of held-out parts only. The ways of asking (styles,
    audiences, languages, counts) are shared: they are the kind, not its subject."""
    if split not in SPLITS:
        raise ValueError(f"prompt_gen: split must be one of {SPLITS}, got {split!r}")
    lists = {k: getattr(W, k.upper()) for k in PARTS}
    if split == "all":
        return lists
    keep = (lambda i: i % 5 == 4) if split == "heldout" else (lambda i: i % 5 != 4)
    return {k: [x for i, x in enumerate(v) if keep(i)] for k, v in lists.items()}


def _arithmetic(r: random.Random, s: dict) -> tuple[str, str]:
    name, item = r.choice(s["names"]), r.choice(s["items"])
    a, b, c = r.randint(3, 60), r.randint(2, 30), r.randint(2, 9)
    kind = r.randrange(5)
    if kind == 0:
        text = (f"{name} has {a} {item} and buys {b} more. Then {name} gives away {c}. "
                f"How many {item} does {name} have now?")
        return text, str(a + b - c)
    if kind == 1:
        text = f"{name} packs {item} into {c} boxes with {b} in each box. How many {item} is that?"
        return text, str(b * c)
    if kind == 2:
        text = f"{name} shares {b * c} {item} equally among {c} friends. How many does each get?"
        return text, str(b)
    if kind == 3:
        price, note = r.randint(2, 9), r.choice([50, 100])
        count = r.randint(2, note // price - 1)
        text = (f"{name} buys {count} {item} at {price} dollars each and pays with a "
                f"{note}-dollar note. How much change does {name} get?")
        return text, str(note - count * price)
    speed, hours = r.randint(20, 90), r.randint(2, 9)
    text = f"A bus drives at {speed} km per hour for {hours} hours. How far does it travel in km?"
    return text, str(speed * hours)


def _subject(kind: str, r: random.Random, s: dict) -> str:
    """A subject of `kind` from one of its families, the family drawn at random (a
    sentence to rewrite comes from the fixed list one time in five: its 26 training
    sentences alone would be recalled, not rewritten)."""
    c = lambda part: r.choice(s[part])  # noqa: E731
    if kind == "rewrite":
        return c("sentences") if r.random() < 0.2 else f"{c('who')} {c('did')} {c('when')}"
    family = r.randrange({"list": 3, "explain": 3, "code": 4}[kind])
    if kind == "list":
        return (c("lists"), f"ways to {c('goals')}", f"{c('people')} from {c('countries')}")[family]
    if kind == "explain":
        return (c("topics"), f"how {c('devices')} works", f"what {c('concepts')} is")[family]
    return (c("code"), f"returns the {c('stats')} of a list of numbers",
            f"checks whether a string {c('props')}", f"converts {c('units')}")[family]


def _draw(kind: str, r: random.Random, s: dict) -> tuple[str, str | None]:
    if kind == "arithmetic":
        text, answer = _arithmetic(r, s)
        return text + " Explain your steps, then give the final answer.", answer
    if kind == "rewrite":
        style = r.choice(STYLES)
        return f"Rewrite this sentence {style}: \"{_subject(kind, r, s).capitalize()}.\"", None
    if kind == "list":
        return f"List {r.randint(3, 9)} {_subject(kind, r, s)}, one per line.", None
    if kind == "explain":
        subject = _subject(kind, r, s)
        return f"Explain {subject}{r.choice(AUDIENCES)} in {r.randint(2, 5)} sentences.", None
    subject = _subject(kind, r, s)
    return f"Write a {r.choice(LANGS)} function that {subject}.{r.choice(CODE_ASKS)}", None


def prompt_set(n: int, seed: int, exclude=(), split: str = "all") -> list[dict]:
    """n distinct prompts, none of whose texts is in `exclude` (deterministic in
    (n, seed, exclude, split)); prompt i's kind is KINDS[i % 5] unless that kind ran
    out. `split`: the subjects drawn from (`subjects`)."""
    pools = subjects(split)
    seen, rows = set(exclude), []
    for i in range(int(n)):
        kind = KINDS[i % len(KINDS)]
        for attempt in range(10_000):
            # past 64 draws of one kind without a new prompt, the kind has run out
            k = kind if attempt < 64 else "arithmetic"
            text, answer = _draw(k, random.Random(f"{seed}/{i}/{attempt}"), pools)
            if text not in seen:
                break
        else:
            raise DataError(f"prompt_gen: no new prompt after 10,000 draws at prompt {i} of "
                            f"{n} (split {split!r}): ask for fewer, or another seed")
        seen.add(text)
        rec = {"id": f"{k}-{i}", "kind": k, "messages": [{"role": "user", "content": text}]}
        if answer is not None:
            rec["answer"] = answer
        rows.append(rec)
    return rows


def write_prompts(n: int, out: str | Path, seed: int = 0, split: str = "all") -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(p) + "\n" for p in prompt_set(n, seed, split=split)))
    return out


@user_errors_exit
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--split", choices=SPLITS, default="all",
                    help="train / heldout: subjects disjoint from the other split's")
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error("--n must be at least 1")
    print(write_prompts(args.n, args.out, args.seed, args.split))


if __name__ == "__main__":
    main()
