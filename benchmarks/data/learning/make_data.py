"""Makes the learning benchmark's data: small tasks with exact answers.

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

Four more, unlike those three in kind (a task a recipe was never tuned on):

* ``sentiment``: a short product review; the answer is ``positive`` or ``negative``.
  Reviews are worded many ways, with negation ("not bad at all"), understatement and
  mixed reviews whose verdict comes after a "but", so no single word gives it away.
* ``field``: an invoice email of 80 to 150 words holding five or six dates; the answer
  is the payment's due date exactly as written (``March 14``).
* ``arithmetic``: a short word problem of one or two operations on small numbers; the
  answer is the number in digits (``12``).
* ``review``: a longer review of one product that names another product in passing;
  the answer is ``"<sentiment> <product>"`` (``"negative kettle"``).  It is
  meant for a two-stage pipeline: stage 1 names the product, stage 2 gives the
  review's sentiment (given the review and the product).

The first three tasks have ``train`` (40), ``val`` (20) and ``test`` (60) splits, the
four others ``train`` (30), ``val`` (10) and ``test`` (60): a validation set that
small is what a user often has, and what a recipe chosen on it must survive.  Lines
are ``{"input": ..., "target": ...}``.  The splits draw ids and fillers from the
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
#: The splits of the tasks added later: a small validation set on purpose.
SMALL_VAL_SIZES = {"train": 30, "val": 10, "test": 60}

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


PRODUCTS = [
    "kettle", "toaster", "blender", "headphones", "backpack", "lamp", "keyboard",
    "umbrella", "tent", "jacket", "charger", "speaker", "thermos", "drill", "mattress",
    "router",
]  # fmt: skip
ASPECTS = ["the design", "the price", "the packaging", "the color", "the manual", "delivery"]
WEAK = ["a bit flimsy", "louder than I hoped", "smaller than it looks", "slow to ship"]
STRONG = ["lovely", "great", "well made", "excellent", "really nice"]
SPANS = ["two weeks", "a month", "three days", "ten days", "six weeks"]

#: Whole short reviews, per verdict; ``{p}`` the product, ``{a}`` an aspect (``{A}``
#: capitalized), ``{w}`` a
#: weakness, ``{s}`` praise, ``{t}`` a span of time.  Many carry the other verdict's
#: words (negated, or before a "but").
REVIEW_SENTENCES = {
    "positive": [
        "Not bad at all, the {p} does what it should.",
        "I can't complain about this {p}.",
        "The {p} is {w}, but it works perfectly and I'd buy it again.",
        "Worth every penny. The {p} has had no problems in {t}.",
        "I was worried about {a}, but the {p} turned out fine and I'm keeping it.",
        "Honestly did not expect much from the {p}. It surprised me.",
        "The {p} never lets me down.",
        "Not the cheapest {p}, yet nothing else I tried comes close.",
        "After {t} the {p} still works like new.",
        "The {p} is {w}, sure, but I use it every day and I'm happy with it.",
        "I had no issues with the {p} at all.",
        "My old one broke after a year; this {p} is much better.",
        "Nothing fancy, but the {p} is reliable and I would recommend it.",
        "Doesn't disappoint. The {p} is exactly what I needed.",
        "I almost sent the {p} back because of {a}, and I'm glad I didn't.",
        "Quietly the best {p} I've owned.",
    ],
    "negative": [
        "The {p} stopped working after {t}.",
        "{A} is {s}, but the {p} broke in {t}, so I'm returning it.",
        "Not worth the money. The {p} feels cheap.",
        "I wanted to like this {p}, I really did.",
        "The {p} is fine, I guess, but it's going back.",
        "Looks {s} in the photos; the {p} that arrived does not.",
        "I wouldn't recommend the {p} to anyone.",
        "Not as good as the reviews say. The {p} is {w} and it shows.",
        "Had high hopes for this {p}. Never again.",
        "The {p} arrived scratched and the seller never replied.",
        "The {p} does not do half of what the listing promises.",
        "After {t} the {p} was already falling apart.",
        "Nice to look at, shame about how the {p} works.",
        "I can't recommend this {p}, it never worked properly.",
        "The {p} is {w}, and the support team was no help at all.",
        "Save your money and skip this {p}.",
    ],
}
OPENERS = ["", "", "", "Bought this a while ago. ", "Update: ", "Second purchase. ",
           "Gift for my dad. "]  # fmt: skip


def review_sentence(rng: random.Random, label: str, product: str) -> str:
    """One review sentence of ``label``'s verdict about ``product``."""
    aspect = rng.choice(ASPECTS)
    text = rng.choice(REVIEW_SENTENCES[label]).format(
        p=product,
        a=aspect,
        A=aspect.capitalize(),
        w=rng.choice(WEAK),
        s=rng.choice(STRONG),
        t=rng.choice(SPANS),
    )
    return text[0].upper() + text[1:]


def sentiment_example(rng: random.Random) -> tuple[str, str]:
    label = rng.choice(["negative", "positive"])
    return rng.choice(OPENERS) + review_sentence(rng, label, rng.choice(PRODUCTS)), label


MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]  # fmt: skip
COMPANIES = ["Northwind Supplies", "Baxter & Lowe", "Greenleaf Print", "Orbit Office Co."]
DUE = [
    "Payment is due by {d}.",
    "Please make sure the payment reaches us no later than {d}.",
    "The due date for this invoice is {d}.",
    "We kindly ask you to settle the amount by {d}.",
    "Kindly note that the balance must be paid by {d}.",
]
DISTRACTORS = [
    "Thank you for your order of {d}, which shipped the following week.",
    "The invoice itself is dated {d}.",
    "Our records show your last payment was received on {d}.",
    "Please note that our office will be closed on {d} for the holiday.",
    "Your account manager will be on leave from {d} onwards.",
    "The price list changes on {d}, so future orders may cost a little more.",
]
FILLERS = [
    "The attached invoice lists every item, the quantities and the unit prices.",
    "If you have any questions about the charges, just reply to this email.",
    "You can pay by bank transfer or by card through our customer portal.",
    "Please quote the invoice number with your payment so we can match it.",
    "We appreciate your business and look forward to working with you again.",
    "If you have already paid, please ignore this reminder.",
]


def field_example(rng: random.Random) -> tuple[str, str]:
    """An invoice email with one due date among several other dates."""
    days = rng.sample([(m, d) for m in MONTHS for d in range(1, 29)], 1 + len(DISTRACTORS))
    dates = [f"{month} {day}" for month, day in days]
    due = dates[0]
    middle = [rng.choice(DUE).format(d=due)]
    others = zip(rng.sample(DISTRACTORS, 5), dates[1:6], strict=True)
    middle += [line.format(d=d) for line, d in others]
    middle += rng.sample(FILLERS, 3)
    rng.shuffle(middle)
    invoice = f"INV-{rng.randrange(1000, 10000)}"
    amount = f"${rng.randrange(80, 5000)}.{rng.randrange(100):02d}"
    text = (
        f"Hello {rng.choice(NAMES)},\n\nPlease find attached invoice {invoice} for {amount}. "
        + " ".join(middle)
        + f"\n\nBest regards,\n{rng.choice(NAMES)}\n{rng.choice(COMPANIES)}"
    )
    assert 80 <= len(text.split()) <= 150, len(text.split())
    return text, due


ITEMS = ["apples", "pencils", "stickers", "books", "marbles", "cookies", "cards", "shells"]


def arithmetic_example(rng: random.Random) -> tuple[str, str]:
    """A word problem of one or two operations on small numbers, and its answer.

    The numbers are one digit (a product or a quotient at most 15): what a 135M model
    can at times get right once shown how to answer, so the task is not 0% whatever
    is learned.
    """
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c = rng.randrange(2, 10), rng.randrange(1, 6), rng.randrange(1, 4)
    kind = rng.randrange(6)
    if kind == 0:
        text = f"{name} has {a} {item} and buys {b} more. How many {item} does {name} have now?"
        return text, str(a + b)
    if kind == 1:
        a += b
        text = f"{name} had {a} {item} and gave {b} to a friend. How many {item} are left?"
        return text, str(a - b)
    if kind == 2:
        a, b = rng.randrange(2, 6), rng.randrange(2, 4)
        text = f"A box holds {a} {item}. How many {item} are in {b} boxes?"
        return text, str(a * b)
    if kind == 3:
        text = (
            f"{name} has {a} {item}, finds {b} more, then loses {c}. "
            f"How many {item} does {name} have?"
        )
        return text, str(a + b - c)
    if kind == 4:
        a, b = rng.randrange(2, 5), rng.randrange(2, 4)
        text = (
            f"There are {a} bags with {b} {item} in each, and {c} {item} are eaten or lost. "
            f"How many {item} remain?"
        )
        return text, str(a * b - c)
    b = rng.randrange(2, 4)
    a = b * rng.randrange(2, 6)
    text = f"{name} shares {a} {item} equally among {b} friends. How many {item} does each get?"
    return text, str(a // b)


REVIEW_CONTEXT = [
    "I ordered the {p} last month, right after my sister's {o} broke.",
    "My neighbour swears by his {o}, so I went looking and ended up buying the {p}.",
    "I bought the {p} in the same sale as something for my brother: his {o}.",
    "The {p} came in a box bigger than my {o}.",
    "I had been using a borrowed {o} until I finally got round to ordering the {p}.",
]
REVIEW_MIDDLE = [
    "I mostly use it on weekends.",
    "It took me ten minutes to set up.",
    "My kids use it more than I do.",
    "It replaced one I had for years.",
    "I read a lot of reviews before choosing.",
]
REVIEW_CLOSERS = [
    "That's all I have to say.",
    "Delivery took about a week.",
    "I paid full price.",
    "Colour as pictured.",
    "",
]


def review_example(rng: random.Random) -> tuple[str, str]:
    """A review of one product that names another in passing."""
    label = rng.choice(["negative", "positive"])
    product, other = rng.sample(PRODUCTS, 2)
    context = rng.choice(REVIEW_CONTEXT).format(p=product, o=other)
    parts = (
        context,
        rng.choice(REVIEW_MIDDLE),
        review_sentence(rng, label, product),
        rng.choice(REVIEW_CLOSERS),
    )
    text = " ".join(part for part in parts if part)
    return text, f"{label} {product}"


def write(
    task: str,
    make: Callable[[random.Random], tuple[str, str]],
    seed: int,
    root: Path = HERE,
    sizes: dict[str, int] = SIZES,
) -> None:
    rng = random.Random(seed)
    seen: set[str] = set()
    folder = root / task
    folder.mkdir(exist_ok=True)
    for split, size in sizes.items():
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
    write("sentiment", sentiment_example, 16, root, SMALL_VAL_SIZES)
    write("field", field_example, 17, root, SMALL_VAL_SIZES)
    write("arithmetic", arithmetic_example, 18, root, SMALL_VAL_SIZES)
    write("review", review_example, 19, root, SMALL_VAL_SIZES)


if __name__ == "__main__":
    make_all()
