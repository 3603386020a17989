"""Training: a sentiment classifier whose system prompt improves from its mistakes.

The classifier is one LLM call; its system prompt is a learnable `plait.Parameter`
with a description (what an optimizer must keep it doing).  A `Trainer` runs
minibatches of labelled reviews through it, turns each wrong label into feedback
text, lets `SFAOptimizer` rewrite the prompt from that feedback, and keeps the
rewrite only if the validation score does not drop.  The same run from a shell:

    plait train examples/train_classifier.py:SentimentClassifier \\
        --data examples/data/sentiment_train.jsonl --val examples/data/sentiment_val.jsonl \\
        --input-field text --target-field label

    python examples/train_classifier.py     # on the embedded local model (a minute or two)
    PLAIT_EXAMPLES_BASE_URL=... python examples/train_classifier.py   # see _resources.py

The embedded model is tiny (135M parameters), so do not expect it to learn much:
the point is the loop.  A real endpoint gives the optimizer something to work with.
"""

from __future__ import annotations

import string
import time
from pathlib import Path
from typing import Any

from _resources import resources_for

import plait
from plait.learning import FunctionLoss, SFAOptimizer, Trainer, TrainingEvent

DATA = Path(__file__).resolve().parent / "data"
INITIAL_PROMPT = "Classify the review."


class SentimentClassifier(plait.Module):
    """Labels a review "positive" or "negative"; the instructions are what training changes."""

    def __init__(self, instructions: str = INITIAL_PROMPT, max_tokens: int = 8) -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "classifier",
            system_prompt=plait.Parameter(
                instructions,
                description=(
                    "System prompt of a sentiment classifier: it must make the model answer "
                    "with exactly one word, positive or negative."
                ),
            ),
            temperature=0.0,
            max_tokens=max_tokens,  # a label, not an essay
        )

    def forward(self, text: str) -> Any:
        return self.llm(f"Review: {text}\nSentiment:")


def names_the_label(output: str, label: str) -> tuple[float, str]:
    """Score 1 when the reply names the right label and not the other one.

    Lenient on purpose: the embedded model rarely answers in one bare word, and
    a loss it can never satisfy gives the optimizer nothing to climb.
    """
    reply = str(output).strip()
    words = {word.strip(string.punctuation).lower() for word in reply.split()}
    other = "negative" if label == "positive" else "positive"
    if label in words and other not in words:
        return 1.0, "correct label"
    return 0.0, f'expected the label "{label}", but the reply was "{reply}"'


def report(event: TrainingEvent) -> None:
    if event.record is not None:
        record = event.record
        verdict = "kept" if record.kept else "rolled back"
        print(
            f"step {record.step}/{event.total_steps}: batch score {record.train_score:.2f}, "
            f"validation {record.val_score:.2f} ({verdict})"
        )


if __name__ == "__main__":
    model = SentimentClassifier()
    resources = resources_for(model)
    # The optimizer's rewrites go to the same endpoint as the classifier (examples use one).
    optimizer = SFAOptimizer(model.parameters(), alias="classifier")
    optimizer.rewriter.max_tokens = 40  # a new system prompt is a sentence or two
    trainer = Trainer(
        model,
        FunctionLoss(names_the_label),
        optimizer.bind(resources),
        DATA / "sentiment_train.jsonl",
        DATA / "sentiment_val.jsonl",
        batch_size=4,
        epochs=1,
        resources=resources,
        input_field="text",
        target_field="label",
        on_event=report,
    )
    started = time.monotonic()
    history = trainer.fit_sync()
    print(f"prompt before: {INITIAL_PROMPT!r}")
    print(f"prompt after:  {model.state_dict()['llm.system_prompt']!r}")
    print(f"validation before: {history.initial_val_score:.2f}")
    print(f"validation after:  {history.final_val_score:.2f}")
    print(f"({len(history.steps)} steps in {time.monotonic() - started:.0f}s)")
