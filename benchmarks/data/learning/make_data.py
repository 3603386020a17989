"""Makes the learning benchmark's data: three small tasks with exact answers.

* ``extract``: a short customer message mentions one order; the answer is the order's
  id exactly as written (``ORD-4821``, ``B-7702`` or ``40291``; a leading ``#`` is
  not part of it).
* ``classify``: a short support message; the answer is one lowercase label:
  ``billing``, ``shipping``, ``technical`` or ``account``.
* ``triage``: a short support message that mentions one order (written as the
  ``extract`` task writes them) and is about one of the four ``classify`` topics; the
  answer is ``"<label> <order id>"``, e.g. ``"shipping ORD-4821"``.  It is meant for a
  two-stage pipeline, each stage with its own demonstrations: stage 1 extracts the
  order id from the message, stage 2 classifies the message (given the message and
  the extracted id), and the pipeline answers ``f"{label} {order}"``.

Each task has ``train`` (40), ``val`` (20) and ``test`` (60) splits of
``{"input": ..., "target": ...}`` lines.  The splits draw ids and fillers from the
same generator but never repeat a message.  Deterministic: re-running rewrites the
same bytes.  Standard library only::

    python benchmarks/data/learning/make_data.py
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZES = {"train": 40, "val": 20, "test": 60}

NAMES = ["Ana", "Ben", "Chloe", "Dev", "Elif", "Femi", "Grace", "Hugo", "Ines", "Jon"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "the weekend"]

EXTRACT_TEMPLATES = [
    "Hi, my order {ref} never arrived, can you check?",
    "Order {ref} was charged twice on my card.",
    "I'm writing about {ref}: the box was damaged.",
    "Where is my package? Order {ref} was due {day}.",
    "Please cancel order {ref}, I ordered the wrong size.",
    "Hello, this is {name}. The parcel for {ref} is missing an item.",
    "Can you update the delivery address on order {ref}?",
    "My refund for order {ref} still hasn't come through.",
    "{name} here: order {ref} came with the wrong color.",
    "The tracking page for {ref} has not changed since {day}.",
    "I want to return the shoes from order {ref}.",
    "Is order {ref} eligible for free shipping?",
]


def order_ref(rng: random.Random) -> tuple[str, str]:
    """The id as the message writes it, and the answer."""
    style = rng.randrange(4)
    if style == 0:
        ident = f"ORD-{rng.randrange(1000, 10000)}"
        return ident, ident
    if style == 1:
        ident = f"{rng.choice('ABCDEFGHJK')}-{rng.randrange(1000, 10000)}"
        return f"#{ident}", ident
    if style == 2:
        ident = str(rng.randrange(10000, 100000))
        return ident, ident
    ident = f"ORD-{rng.randrange(1000, 10000)}"
    return f"#{ident}", ident


def extract_example(rng: random.Random) -> tuple[str, str]:
    written, answer = order_ref(rng)
    text = rng.choice(EXTRACT_TEMPLATES).format(
        ref=written, name=rng.choice(NAMES), day=rng.choice(DAYS)
    )
    return text, answer


CLASSIFY_TEMPLATES = {
    "billing": [
        "I was charged twice for my last purchase.",
        "Why does my invoice show a fee of ${n}?",
        "Please refund the ${n} you took from my card.",
        "My payment of ${n} failed but the money left my account.",
        "Can I get a receipt for my payment from {day}?",
    ],
    "shipping": [
        "My parcel has been stuck in transit since {day}.",
        "The courier left my package at the wrong address.",
        "When will my order of {n} items be delivered?",
        "The tracking number you sent me does not work.",
        "My delivery was due {day} and nothing came.",
    ],
    "technical": [
        "The app crashes every time I open the cart.",
        "I get error {n} when I try to check out.",
        "The website will not load on my phone since {day}.",
        "The search button does nothing when I click it.",
        "Your page shows a blank screen after I log in.",
    ],
    "account": [
        "I forgot my password and the reset email never comes.",
        "Please change the email address on my profile.",
        "How do I delete my account?",
        "Someone else logged into my account on {day}.",
        "I want to change my username to {name}{n}.",
    ],
}


def classify_example(rng: random.Random) -> tuple[str, str]:
    label = rng.choice(sorted(CLASSIFY_TEMPLATES))
    text = rng.choice(CLASSIFY_TEMPLATES[label]).format(
        n=rng.randrange(2, 500), day=rng.choice(DAYS), name=rng.choice(NAMES)
    )
    if rng.random() < 0.5:
        text = f"{rng.choice(['Hello.', 'Hi there,', 'Good morning.', 'Help!'])} {text}"
    return text, label


TRIAGE_TEMPLATES = {
    "billing": [
        "Order {ref} was charged twice on my card.",
        "Why was I billed an extra fee for order {ref}?",
        "Please refund the payment you took for order {ref}.",
        "My payment for {ref} failed but the money left my account.",
        "Can I get a receipt for order {ref}? I paid on {day}.",
    ],
    "shipping": [
        "My parcel for order {ref} has been stuck in transit since {day}.",
        "The courier left order {ref} at the wrong address.",
        "When will order {ref} be delivered?",
        "The tracking number for {ref} does not work.",
        "Order {ref} was due {day} and nothing came.",
    ],
    "technical": [
        "The app crashes every time I open order {ref}.",
        "I get an error page when I open the details of order {ref}.",
        "The website will not load the page for order {ref} since {day}.",
        "The reorder button does nothing on order {ref}.",
        "Your site shows a blank screen when I view {ref}.",
    ],
    "account": [
        "I placed order {ref} but forgot my password and the reset email never comes.",
        "Please move order {ref} to the new email address on my profile.",
        "Someone else logged into my account on {day} and placed order {ref}.",
        "I can't sign in to my account to see order {ref}.",
        "My profile still shows my old name on order {ref}, please change it to {name}.",
    ],
}


def triage_example(rng: random.Random) -> tuple[str, str]:
    label = rng.choice(sorted(TRIAGE_TEMPLATES))
    written, answer = order_ref(rng)
    text = rng.choice(TRIAGE_TEMPLATES[label]).format(
        ref=written, day=rng.choice(DAYS), name=rng.choice(NAMES)
    )
    if rng.random() < 0.5:
        text = f"{rng.choice(['Hello.', 'Hi there,', 'Good morning.', 'Help!'])} {text}"
    return text, f"{label} {answer}"


def write(
    task: str, make: Callable[[random.Random], tuple[str, str]], seed: int, root: Path = HERE
) -> None:
    rng = random.Random(seed)
    seen: set[str] = set()
    folder = root / task
    folder.mkdir(exist_ok=True)
    for split, size in SIZES.items():
        rows: list[str] = []
        while len(rows) < size:
            text, target = make(rng)
            if text in seen:
                continue
            seen.add(text)
            rows.append(json.dumps({"input": text, "target": target}) + "\n")
        (folder / f"{split}.jsonl").write_text("".join(rows), encoding="utf-8")


def make_all(root: Path = HERE) -> None:
    """Every task's splits, in ``root/<task>/``."""
    write("extract", extract_example, 13, root)
    write("classify", classify_example, 14, root)
    write("triage", triage_example, 15, root)


if __name__ == "__main__":
    make_all()
