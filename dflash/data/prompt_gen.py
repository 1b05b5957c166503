"""A prompt set for on-policy data: chat prompts a target answers, no download needed.

    python -m dflash.data.prompt_gen --n 400 --out prompts.jsonl [--seed 0] [--split train]

Five kinds, drawn in turn, each from templates filled with seeded choices: arithmetic
word problems (with the answer, so replies can be checked), rewriting a sentence,
listing items, short explanations, and small code tasks. Each line is a prompt-only
conversation ({"id", "kind", "messages": [{"role": "user", ...}], "answer"?}), which
`dflash.regenerate` answers with the target (its reply becomes the final turn).

Every prompt of a set is distinct (a repeated prompt is a repeated greedy reply: time
spent generating it again, and a training set that teaches one reply twice). A kind
whose templates run out (a few hundred prompts each) gives its turn to arithmetic,
whose numbers do not run out.

`split`: every fifth subject of each list (sentence, list subject, topic, code task,
name, item) is held out. `split="train"` draws from the other four fifths only,
`split="heldout"` from the held-out fifth only, so held-out prompts ask about subjects
no training prompt mentions (a prompt that differs from a training one only in its
count or audience gets a reply that shares whole sentences with that prompt's: it
measures recall of the training replies, not drafting). `all`: every subject.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

KINDS = ("arithmetic", "rewrite", "list", "explain", "code")
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivo", "Jun",
         "Kofi", "Lena", "Mateo", "Nina", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tomas"]
ITEMS = ["apples", "books", "pencils", "stamps", "marbles", "cookies", "tickets", "shells",
         "stickers", "coins", "cards", "buttons", "eggs", "bottles", "plants", "candles"]
TOPICS = ["why the sky is blue", "how a bicycle stays upright", "what a prime number is",
          "how vaccines work", "why ice floats", "what inflation is", "how rainbows form",
          "what a hash table is", "why leaves change colour", "how a compiler works",
          "how the heart pumps blood", "what photosynthesis does", "how a battery stores energy",
          "why the moon has phases", "what a neural network is", "how tides work",
          "what an API is", "why bread rises", "how an airplane wing makes lift",
          "what recursion is", "how earthquakes happen", "what a black hole is",
          "how interest on a loan works", "why we have seasons", "what DNA does",
          "how a refrigerator keeps food cold", "what encryption is", "how sound travels",
          "why metal feels colder than wood", "what a database index is",
          "how a solar panel makes electricity", "what a volcano is",
          "how the internet routes data", "why the ocean is salty",
          "what a currency exchange rate is", "how muscles grow", "how a thermostat works",
          "why cats purr", "what gravity does", "how a search engine ranks pages"]
AUDIENCES = ["", " to a ten-year-old", " to a first-year university student"]
SENTENCES = ["the meeting was moved to friday because the room was booked",
             "our team finished the project early and under budget",
             "the train was late so we missed the first half of the film",
             "she fixed the bug after reading the logs for an hour",
             "the new library opens next month with longer hours",
             "he forgot his umbrella and got soaked on the way home",
             "the company will hire ten engineers this spring",
             "we cancelled the picnic because of the storm warning",
             "the recipe needs two cups of flour and a pinch of salt",
             "my neighbour has been learning to play the violin",
             "the report was sent to the client before the deadline",
             "they painted the kitchen a bright shade of yellow",
             "the museum is free for students on sundays",
             "our flight was delayed by three hours at the airport",
             "the children planted tomatoes in the school garden",
             "the software update fixed the battery drain on older phones",
             "the bakery on the corner sells fresh bread every morning",
             "the bus driver waited for the last passenger to board",
             "our manager approved the budget for the new laptops",
             "the river flooded the fields after a week of heavy rain",
             "my sister finished her first marathon in four hours",
             "the council will repair the road before winter",
             "the students presented their science project to the parents",
             "the printer ran out of paper during the exam",
             "we booked a table by the window for seven people",
             "the old bridge will be closed for repairs until may",
             "the dog barked at the mail carrier every morning",
             "the hotel upgraded our room because the lift was broken",
             "the team lost the final after a penalty shootout",
             "the lab results will be ready on thursday afternoon",
             "he sold his car and now rides a bicycle to work",
             "the store offers free delivery on orders over fifty dollars"]
STYLES = ["more formal", "shorter", "friendlier", "in the passive voice", "as a question",
          "more politely", "for a newspaper headline", "in simpler words",
          "more enthusiastic", "in the future tense"]
LISTS = ["fruits that are red", "countries in South America", "ways to save energy at home",
         "programming languages", "musical instruments", "tips for a job interview",
         "animals that live in the ocean", "board games for a family evening",
         "healthy breakfast ideas", "famous scientists", "things to pack for a camping trip",
         "ways to reduce stress", "vegetables that grow underground", "European capitals",
         "hobbies you can do indoors", "parts of a computer", "birds found in cities",
         "questions to ask a new landlord", "sports played with a ball",
         "uses for a spreadsheet", "kitchen tools every cook needs", "rivers in Africa",
         "ways to learn a new language", "safety rules for a science lab",
         "cities in Asia", "flowers that bloom in spring", "ways to stay focused while studying",
         "tools for a home workshop", "famous painters", "mammals that can swim",
         "ingredients for a simple salad", "ways to make a small room feel bigger",
         "types of clouds", "desserts from France", "jobs that involve travel",
         "reasons to keep a journal", "materials that conduct electricity", "winter sports",
         "apps that help with productivity", "ways to cut down on sugar"]
CODE = ["reverses a string", "checks whether a number is prime", "returns the largest of a "
        "list of numbers", "counts the vowels in a string", "computes the factorial of n",
        "merges two sorted lists", "removes duplicates from a list",
        "checks whether a string is a palindrome", "returns the n-th Fibonacci number",
        "sums the digits of an integer", "converts Celsius to Fahrenheit",
        "finds the second smallest number in a list", "counts the words in a sentence",
        "returns the greatest common divisor of two numbers",
        "checks whether a year is a leap year", "capitalizes the first letter of each word",
        "returns the average of a list of numbers", "checks whether two strings are anagrams",
        "counts how often each character appears in a string",
        "finds an item in a sorted list by binary search",
        "converts a number of seconds to hours and minutes",
        "returns the even numbers of a list", "reverses the order of words in a sentence",
        "checks whether a list is sorted"]
LANGS = ["Python", "JavaScript", "C", "Rust", "Go", "Java"]
CODE_ASKS = ["", " Add a short comment explaining it.", " Include one example call."]
SPLITS = ("all", "train", "heldout")


def subjects(split: str) -> dict:
    """Each subject list as `split` sees it: every fifth entry (index 4, 9, ...) is held
    out. The ways of asking (styles, audiences, languages, counts) are shared: they
    are the kind, not its subject."""
    if split not in SPLITS:
        raise ValueError(f"prompt_gen: split must be one of {SPLITS}, got {split!r}")
    lists = dict(names=NAMES, items=ITEMS, sentences=SENTENCES, lists=LISTS, topics=TOPICS,
                 code=CODE)
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


def _draw(kind: str, r: random.Random, s: dict) -> tuple[str, str | None]:
    if kind == "arithmetic":
        text, answer = _arithmetic(r, s)
        return text + " Explain your steps, then give the final answer.", answer
    if kind == "rewrite":
        return (f"Rewrite this sentence {r.choice(STYLES)}: "
                f"\"{r.choice(s['sentences']).capitalize()}.\""), None
    if kind == "list":
        return f"List {r.randint(3, 9)} {r.choice(s['lists'])}, one per line.", None
    if kind == "explain":
        return (f"Explain {r.choice(s['topics'])}{r.choice(AUDIENCES)} in "
                f"{r.randint(2, 5)} sentences."), None
    return f"Write a {r.choice(LANGS)} function that {r.choice(s['code'])}.{r.choice(CODE_ASKS)}", None


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
            raise ValueError(f"prompt_gen: no new prompt after 10,000 draws at prompt {i}")
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
