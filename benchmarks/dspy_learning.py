"""DSPy's optimizers on plait's learning benchmark: the same model, data and held-out sets.

The baseline for ``benchmarks/learning.py``: DSPy's ``BootstrapFewShotWithRandomSearch``
(``bfsrs``), ``MIPROv2`` (``mipro``) and ``GEPA`` (``gepa``) train DSPy programs on the
seven tasks of ``benchmarks/data/learning/`` (``extract``, ``classify``, the two-stage
``triage``, ``sentiment``, ``field``, ``arithmetic`` and the two-stage ``review``), on
the embedded SmolLM2-135M-Instruct served by plait's own OpenAI-compatible server
(``benchmarks/serve_local.py``, started here as a subprocess with plait's venv: the
model runs in plait's runtime with the settings of plait's default local alias), at
temperature 0 with DSPy's cache off, so every request is real and counted by the server.

Runs in DSPy's own venv (``make dspy-venv`` builds ``benchmarks/.dspy-venv``)::

    benchmarks/.dspy-venv/bin/python benchmarks/dspy_learning.py \\
        [--tasks extract,classify,...] [--optimizers bfsrs,mipro,gepa] [--seeds 0,1,2]

Per task, optimizer and seed: held-out exact-match accuracy on ``test.jsonl`` before
and after training (trainset = ``train.jsonl``, valset = ``val.jsonl``), validation
accuracy after, the requests the server answered and the wall time (for the compile
step and the evaluations after it; the requests of the compile step alone are kept
too).  Results are merged into ``benchmarks/results/dspy_learning.json`` (keyed by
task, optimizer and seed, so runs made by separate invocations add up), and a markdown
table of every stored run is printed with, per task and optimizer, the mean and the
min-max over seeds.  ``--quick`` is a smoke test, not a measurement: the first 5
examples of each split and the smallest budgets; its rows are marked ``smoke`` and
never stored in the default results file.

The programs, as DSPy writes them (the starting instructions are plait's, word for word):

* ``extract``: ``dspy.Predict(message -> order_id)``, instruction "Extract the order
  number from the customer's message."
* ``classify``: ``dspy.Predict(message -> label: Literal[billing, shipping, technical,
  account])``, instruction "Classify the customer's message."
* ``triage``: two ``dspy.Predict`` stages, each with its own demonstrations: the
  extraction above, then ``(message, order_id) -> label``; the answer is
  ``f"{label} {order_id}"``.
* ``sentiment``: ``dspy.Predict(review -> sentiment: Literal[positive, negative])``,
  instruction "Is this product review positive or negative?"
* ``field``: ``dspy.Predict(email -> due_date)``, instruction "Extract the date the
  invoice's payment is due from the email."
* ``arithmetic``: ``dspy.Predict(problem -> answer)``, instruction "Solve the word
  problem."
* ``review``: two stages, ``find`` = ``dspy.Predict(review -> product)`` ("Name the
  product this review is about."), then ``judge`` = ``dspy.Predict(review, product ->
  sentiment: Literal[positive, negative])`` ("Is this product review positive or
  negative?"); the answer is ``f"{sentiment} {product}"``.

Each example carries, besides its target, each output field's share of it (for the
two-stage tasks the target split at its first space: the same information), so
labeled demonstrations fill every stage.

The metric is exact match after stripping whitespace, as plait's ``ExactMatch``; GEPA's
adds a sentence of feedback (``feedback_metric``).  Seeds: ``MIPROv2`` and ``GEPA``
take the run's seed as their own ``seed``; ``BootstrapFewShotWithRandomSearch`` has no
seed (its candidate seeds are always -3..N-1), so the run's seed shuffles the trainset
it is given (seed 0 included).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

# DSPy would otherwise fetch a model-price map from the internet on first use (this
# benchmark talks to loopback only); the bundled copy is enough for a local model.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = HERE / "data" / "learning"
RESULTS = HERE / "results" / "dspy_learning.json"
DSPY_VENV = HERE / ".dspy-venv"
SERVER = HERE / "serve_local.py"
PLAIT_PYTHON = ROOT / ".venv" / "bin" / "python"

try:
    import dspy
except ImportError:
    sys.exit(
        "dspy_learning.py runs in DSPy's own venv, and dspy is not importable here "
        f"({sys.executable}): build the venv with `make dspy-venv`, then run "
        f"{DSPY_VENV.relative_to(ROOT)}/bin/python benchmarks/dspy_learning.py"
    )

from dspy.propose.grounded_proposer import GroundedProposer  # noqa: E402
from dspy.teleprompt.gepa.gepa_utils import DspyAdapter  # noqa: E402
from dspy.teleprompt.gepa.instruction_proposal import InstructionProposer  # noqa: E402
from dspy.teleprompt.utils import get_signature  # noqa: E402

LABELS = ("billing", "shipping", "technical", "account")
Label = Literal["billing", "shipping", "technical", "account"]
Verdict = Literal["positive", "negative"]
TASKS = ("extract", "classify", "triage", "sentiment", "field", "arithmetic", "review")
OPTIMIZERS = ("bfsrs", "mipro", "gepa")
OPTIMIZER_NAMES = {
    "bfsrs": "BootstrapFewShotWithRandomSearch",
    "mipro": "MIPROv2",
    "gepa": "GEPA",
}


class ExtractOrder(dspy.Signature):
    """Extract the order number from the customer's message."""

    message: str = dspy.InputField()
    order_id: str = dspy.OutputField()


class ClassifyMessage(dspy.Signature):
    """Classify the customer's message."""

    message: str = dspy.InputField()
    label: Label = dspy.OutputField()


class ClassifyWithOrder(dspy.Signature):
    """Classify the customer's message."""

    message: str = dspy.InputField()
    order_id: str = dspy.InputField()
    label: Label = dspy.OutputField()


class Extract(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.extract = dspy.Predict(ExtractOrder)

    def forward(self, message: str) -> dspy.Prediction:
        found = self.extract(message=message)
        return dspy.Prediction(order_id=found.order_id, answer=str(found.order_id))


class Classify(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.classify = dspy.Predict(ClassifyMessage)

    def forward(self, message: str) -> dspy.Prediction:
        found = self.classify(message=message)
        return dspy.Prediction(label=found.label, answer=str(found.label))


class Triage(dspy.Module):
    """Stage 1 extracts the order id, stage 2 classifies the message given it."""

    def __init__(self) -> None:
        super().__init__()
        self.extract = dspy.Predict(ExtractOrder)
        self.classify = dspy.Predict(ClassifyWithOrder)

    def forward(self, message: str) -> dspy.Prediction:
        order = str(self.extract(message=message).order_id).strip()
        label = str(self.classify(message=message, order_id=order).label).strip()
        return dspy.Prediction(order_id=order, label=label, answer=f"{label} {order}")


class JudgeReview(dspy.Signature):
    """Is this product review positive or negative?"""

    review: str = dspy.InputField()
    sentiment: Verdict = dspy.OutputField()


class FindDueDate(dspy.Signature):
    """Extract the date the invoice's payment is due from the email."""

    email: str = dspy.InputField()
    due_date: str = dspy.OutputField()


class SolveProblem(dspy.Signature):
    """Solve the word problem."""

    problem: str = dspy.InputField()
    answer: str = dspy.OutputField()


class NameProduct(dspy.Signature):
    """Name the product this review is about."""

    review: str = dspy.InputField()
    product: str = dspy.OutputField()


class JudgeWithProduct(dspy.Signature):
    """Is this product review positive or negative?"""

    review: str = dspy.InputField()
    product: str = dspy.InputField()
    sentiment: Verdict = dspy.OutputField()


class Sentiment(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.judge = dspy.Predict(JudgeReview)

    def forward(self, review: str) -> dspy.Prediction:
        found = self.judge(review=review)
        return dspy.Prediction(sentiment=found.sentiment, answer=str(found.sentiment))


class Field(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.extract = dspy.Predict(FindDueDate)

    def forward(self, email: str) -> dspy.Prediction:
        found = self.extract(email=email)
        return dspy.Prediction(due_date=found.due_date, answer=str(found.due_date))


class Arithmetic(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.solve = dspy.Predict(SolveProblem)

    def forward(self, problem: str) -> dspy.Prediction:
        return dspy.Prediction(answer=str(self.solve(problem=problem).answer))


class Review(dspy.Module):
    """Stage ``find`` names the product, stage ``judge`` gives the review's sentiment
    given it."""

    def __init__(self) -> None:
        super().__init__()
        self.find = dspy.Predict(NameProduct)
        self.judge = dspy.Predict(JudgeWithProduct)

    def forward(self, review: str) -> dspy.Prediction:
        product = str(self.find(review=review).product).strip()
        verdict = str(self.judge(review=review, product=product).sentiment).strip()
        return dspy.Prediction(product=product, sentiment=verdict, answer=f"{verdict} {product}")


def _whole(field: str) -> Callable[[str], dict[str, str]]:
    """A one-stage target: the value of the program's one output field."""
    return lambda target: {field: target}


def _split(first: str, rest: str) -> Callable[[str], dict[str, str]]:
    """A two-stage target ``"<first> <rest>"``: the value of each stage's output field."""

    def fields(target: str) -> dict[str, str]:
        head, tail = target.split(" ", 1)
        return {first: head, rest: tail}

    return fields


@dataclass(frozen=True)
class Task:
    """A task as DSPy runs it: its program, the name of the program's input field, and
    the value of each output field from an example's target (the same information,
    split, so that labeled demos fill every stage)."""

    program: Callable[[], dspy.Module]
    input: str
    fields: Callable[[str], dict[str, str]]


SPECS: dict[str, Task] = {
    "extract": Task(Extract, "message", _whole("order_id")),
    "classify": Task(Classify, "message", _whole("label")),
    "triage": Task(Triage, "message", _split("label", "order_id")),
    "sentiment": Task(Sentiment, "review", _whole("sentiment")),
    "field": Task(Field, "email", _whole("due_date")),
    "arithmetic": Task(Arithmetic, "problem", _whole("answer")),
    "review": Task(Review, "review", _split("sentiment", "product")),
}
PROGRAMS: dict[str, Callable[[], dspy.Module]] = {
    name: spec.program for name, spec in SPECS.items()
}


def load(task: str, split: str) -> list[dspy.Example]:
    """A split as DSPy examples: the task's input field in; the target, and each output
    field's share of it, out."""
    spec = SPECS[task]
    examples = []
    path = DATA / task / f"{split}.jsonl"
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        fields = {spec.input: row["input"], "target": row["target"], **spec.fields(row["target"])}
        examples.append(dspy.Example(**fields).with_inputs(spec.input))
    return examples


def exact_match(example: dspy.Example, prediction: dspy.Prediction, trace: Any = None) -> float:
    """1.0 when the program's answer is the target, whitespace stripped (plait's
    ExactMatch); 0.0 otherwise, a failed parse included."""
    answer = getattr(prediction, "answer", None)
    return float(answer is not None and str(answer).strip() == str(example.target).strip())


def feedback_metric(
    example: dspy.Example,
    prediction: dspy.Prediction,
    trace: Any = None,
    pred_name: str | None = None,
    pred_trace: Any = None,
) -> dspy.Prediction:
    """GEPA's metric: `exact_match`'s score, with a sentence saying what was wrong.

    Asked about one stage (``pred_name``, ``pred_trace`` holding that stage's call), the
    sentence is about that stage's own output fields, compared with the example's
    share of the target (a two-stage program's stages each hear about their own
    field); otherwise about the program's answer.  The score is always the program's
    (GEPA keeps the program-level score either way).
    """
    score = exact_match(example, prediction)
    if pred_trace:
        predictor, _inputs, outputs = pred_trace[0]
        stage = list(predictor.signature.output_fields)
        notes = []
        for name in stage:
            expected = str(example.get(name, "")).strip()
            got = str(outputs.get(name, "")).strip()
            if got == expected:
                notes.append(f"{name} correct: {expected!r}.")
            else:
                notes.append(f"{name} wrong: expected {expected!r}, got {got!r}.")
        if len(example.labels()) - 1 > len(stage):  # the target, and each stage's field
            whole = "right" if score else f"wrong (expected {str(example.target).strip()!r})"
            notes.append(f"The pipeline's whole answer was {whole}.")
        return dspy.Prediction(score=score, feedback=" ".join(notes))
    answer = str(getattr(prediction, "answer", "")).strip()
    if score:
        return dspy.Prediction(score=score, feedback=f"Correct: the answer is {answer!r}.")
    expected = str(example.target).strip()
    return dspy.Prediction(score=score, feedback=f"Wrong: expected {expected!r}, got {answer!r}.")


#: MIPROv2's instruction proposals: written, and failed to parse (kept as the original).
PROPOSALS = {"written": 0, "failed": 0}
_propose = GroundedProposer.propose_instruction_for_predictor


def _guarded_propose(self: GroundedProposer, *args: Any, **kwargs: Any) -> str:
    """MIPROv2's proposal step, with an unparseable proposal kept as the current
    instruction instead of ending the run.

    DSPy 3.4.1 guards the proposer's data summary and program description against a
    prompt model whose reply does not parse, but not the proposal itself: with the
    135M model as prompt model most proposals fail to parse and ``compile`` raises.
    The one change this benchmark makes to DSPy: such a proposal counts as "no new
    instruction" (counted in ``proposals_failed``), so MIPROv2 still searches the
    demonstration sets and whatever instructions did parse.
    """
    try:
        written = _propose(self, *args, **kwargs)
    except Exception:  # AdapterParseError and the like, from the 135M prompt model
        PROPOSALS["failed"] += 1
        return str(get_signature(kwargs["predictor"]).instructions)
    PROPOSALS["written"] += 1
    return str(written)


GroundedProposer.propose_instruction_for_predictor = _guarded_propose  # type: ignore[method-assign]


#: GEPA's reflections: instructions written, proposals that raised (GEPA skips the
#: iteration; its engine retries a failed proposal once, and each try counts), and
#: iterations with no example to reflect on (every reply of the parent's minibatch
#: unparseable, when parse failures are not shown as feedback).
REFLECTIONS = {"written": 0, "failed": 0, "no_examples": 0}


class CountedProposer(InstructionProposer):
    """DSPy's own GEPA instruction proposer (the default one), counted in `REFLECTIONS`;
    what it does is unchanged, a failure included (re-raised for GEPA to handle)."""

    def __call__(
        self,
        candidate: dict[str, str],
        reflective_dataset: Any,
        components_to_update: list[str],
    ) -> dict[str, str]:
        try:
            written = super().__call__(candidate, reflective_dataset, components_to_update)
        except Exception:
            REFLECTIONS["failed"] += 1
            raise
        REFLECTIONS["written"] += len(written)
        return written


_reflective_dataset = DspyAdapter.make_reflective_dataset


def _counted_reflective_dataset(self: DspyAdapter, *args: Any, **kwargs: Any) -> Any:
    """GEPA's reflective dataset as DSPy builds it, counting the iterations where there is
    none (DSPy raises, and GEPA skips the iteration)."""
    try:
        return _reflective_dataset(self, *args, **kwargs)
    except Exception:
        REFLECTIONS["no_examples"] += 1
        raise


DspyAdapter.make_reflective_dataset = _counted_reflective_dataset  # type: ignore[method-assign]


def reflection_max_tokens(instructions: list[str]) -> int:
    """The reflection LM's ``max_tokens``: plait's rule for its rewriter's default budget
    (``plait.learning.optimizers.rewrite_max_tokens``) on the longest starting
    instruction: room for a rewrite of ``max(4 * len, len + 400)`` characters at about
    four characters a token, plus 64 tokens for the structured reply, at most 4096."""
    size = max(len(text) for text in instructions)
    return min(4096, max(4 * size, size + 400) // 4 + 64)


class Server:
    """``serve_local.py`` as a subprocess: started, waited on, counted, stopped."""

    def __init__(self, python: Path, slots: int) -> None:
        if not python.is_file():
            sys.exit(
                f"plait's python {python} is missing: pass --server-python, a python with "
                "plait[local] and the default model installed (`make setup`)"
            )
        self.ready = Path(tempfile.mkdtemp(prefix="dspy-learning-")) / "port"
        self.log = self.ready.with_name("server.log")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "src")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
        command = [str(python), str(SERVER), "--port", "0", "--ready-file", str(self.ready)]
        command += ["--slots", str(slots), "--exit-on-stdin-eof"]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,  # closed when this process ends: the server stops
            stdout=subprocess.PIPE,
            stderr=open(self.log, "wb"),  # noqa: SIM115 (kept open for the server's life)
            text=True,
            env=env,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # blocks until serving, or EOF if it died
        if not line.startswith("serving "):
            self.process.wait()
            sys.exit(
                f"the model server did not start (exit {self.process.returncode}):\n"
                + self.log.read_text(errors="replace").strip()
            )
        self.base = line.split(" ", 1)[1].strip()
        self.root = self.base.removesuffix("/v1")
        models = self._get("/v1/models")
        self.model = str(models["data"][0]["id"])

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self.root + path, timeout=30) as response:
            return json.load(response)

    def stats(self) -> dict[str, int]:
        return {k: int(v) for k, v in self._get("/stats").items()}

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def serving(python: Path, slots: int) -> Iterator[Server]:
    server = Server(python, slots)
    try:
        yield server
    finally:
        server.stop()


def evaluate(program: dspy.Module, devset: list[dspy.Example], threads: int) -> float:
    run = dspy.Evaluate(
        devset=devset,
        metric=exact_match,
        num_threads=threads,
        display_progress=False,
        max_errors=10**9,
    )
    return float(run(program).score) / 100.0


def gepa_budget(args: argparse.Namespace) -> dict[str, Any]:
    """GEPA's budget: ``auto`` when ``--gepa-auto`` names one, else ``max_metric_calls``."""
    if args.gepa_auto != "none":
        return {"auto": args.gepa_auto}
    return {"max_metric_calls": args.gepa_budget}


def optimizer_for(name: str, args: argparse.Namespace, seed: int, prompt_lm: dspy.LM) -> Any:
    """The optimizer ``name``; ``prompt_lm`` is MIPROv2's prompt model or GEPA's
    reflection LM (the same served model, with their own sampling settings)."""
    if name == "bfsrs":
        return dspy.BootstrapFewShotWithRandomSearch(
            metric=exact_match,
            max_bootstrapped_demos=4,
            max_labeled_demos=4,
            num_candidate_programs=args.candidates,
            num_threads=args.threads,
            max_errors=10**9,
        )
    if name == "mipro":
        settings: dict[str, Any] = {"auto": args.mipro_auto}
        if args.mipro_auto == "none":
            settings = {"auto": None, "num_candidates": args.mipro_candidates}
        return dspy.MIPROv2(
            metric=exact_match,
            prompt_model=prompt_lm,
            task_model=dspy.settings.lm,
            max_bootstrapped_demos=4,
            max_labeled_demos=4,
            num_threads=args.threads,
            max_errors=10**9,
            seed=seed,
            **settings,
        )
    if name == "gepa":
        return dspy.GEPA(
            metric=feedback_metric,
            reflection_lm=prompt_lm,
            instruction_proposer=CountedProposer(),
            add_format_failure_as_feedback=args.gepa_format_feedback,
            num_threads=args.threads,
            seed=seed,
            track_stats=True,
            **gepa_budget(args),
        )
    raise SystemExit(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")


def compile_with(
    name: str,
    optimizer: Any,
    program: dspy.Module,
    train: list[dspy.Example],
    val: list[dspy.Example],
    seed: int,
    args: argparse.Namespace,
) -> dspy.Module:
    if name == "bfsrs":
        shuffled = list(train)
        random.Random(seed).shuffle(shuffled)
        return optimizer.compile(program, trainset=shuffled, valset=val)
    if name == "gepa":  # its seed was given to the optimizer
        return optimizer.compile(program, trainset=train, valset=val)
    extra: dict[str, Any] = {}
    if args.mipro_auto == "none":
        extra |= {"num_trials": args.mipro_trials, "minibatch": False}
    return optimizer.compile(program, trainset=train, valset=val, seed=seed, **extra)


def describe(program: dspy.Module) -> list[dict[str, Any]]:
    """Each predictor's instruction and demonstrations after training."""
    out = []
    for name, predictor in program.named_predictors():
        demos = [
            {k: v for k, v in dict(demo).items() if k not in ("target",)}
            for demo in predictor.demos
        ]
        out.append(
            {
                "predictor": name,
                "instruction": predictor.signature.instructions,
                "demos": demos,
            }
        )
    return out


def start_scores(server: Server, task: str, args: argparse.Namespace) -> dict[str, Any]:
    """The untrained program's held-out accuracy: the same program for every optimizer
    and seed (temperature 0), so it is measured once per task and invocation."""
    test = load(task, "test")[: args.limit or None]
    before = server.stats()
    started = time.perf_counter()
    score = evaluate(PROGRAMS[task](), test, args.threads)
    after = server.stats()
    return {
        "test_start": score,
        "start_requests": after["requests"] - before["requests"],
        "start_wall_s": time.perf_counter() - started,
    }


def reused_start(path: Path | None, task: str, tests: int) -> dict[str, Any] | None:
    """The untrained program's score on ``task`` as a results file already holds it
    (from a run scored on as many test examples, ``tests``: a smoke run's start is not
    a measurement's)."""
    if path is None or not path.exists():
        return None
    for row in json.loads(path.read_text())["runs"]:
        if row["task"] == task and row["sizes"][2] == tests:
            names = ("test_start", "start_requests", "start_wall_s")
            return {name: row[name] for name in names} | {"reused_from": str(path)}
    return None


def run_one(
    server: Server,
    task: str,
    name: str,
    seed: int,
    start: dict[str, Any],
    args: argparse.Namespace,
) -> dict[str, Any]:
    train, val, test = (load(task, split) for split in ("train", "val", "test"))
    if args.limit:
        train, val, test = train[: args.limit], val[: args.limit], test[: args.limit]
    program = PROGRAMS[task]()
    prompt_lm = dspy.LM(
        f"openai/{server.model}",
        api_base=server.base,
        api_key="none",
        cache=False,
        **prompt_settings(name, program, args),
    )
    load_start = os.getloadavg()[0]
    counts = REFLECTIONS if name == "gepa" else PROPOSALS  # the instructions written
    before_counts = dict(counts)
    before = server.stats()
    started = time.perf_counter()
    optimizer = optimizer_for(name, args, seed, prompt_lm)
    trained = compile_with(name, optimizer, program, train, val, seed, args)
    compile_wall = time.perf_counter() - started
    compiled = server.stats()
    val_end = evaluate(trained, val, args.threads)
    test_end = evaluate(trained, test, args.threads)
    wall = time.perf_counter() - started
    after = server.stats()
    return {
        "task": task,
        "optimizer": name,
        "optimizer_class": OPTIMIZER_NAMES[name],
        "seed": seed,
        "test_start": start["test_start"],
        "test_end": test_end,
        "val_end": val_end,
        "requests": after["requests"] - before["requests"],
        "compile_requests": compiled["requests"] - before["requests"],
        "failed_requests": after["failed"] - before["failed"],
        "prompt_tokens": after["prompt_tokens"] - before["prompt_tokens"],
        "completion_tokens": after["completion_tokens"] - before["completion_tokens"],
        "wall_s": wall,
        "compile_wall_s": compile_wall,
        "start_requests": start["start_requests"],
        "start_wall_s": start["start_wall_s"],
        "load_average": [load_start, os.getloadavg()[0]],
        "proposals_written": counts["written"] - before_counts["written"],
        "proposals_failed": counts["failed"] - before_counts["failed"],
        **(gepa_account(trained, before_counts) if name == "gepa" else {}),
        "sizes": [len(train), len(val), len(test)],
        "smoke": bool(args.limit),
        "settings": settings_of(name, args)
        | ({"prompt_lm": prompt_settings(name, program, args)} if name != "bfsrs" else {}),
        "program": describe(trained),
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def prompt_settings(name: str, program: dspy.Module, args: argparse.Namespace) -> dict[str, Any]:
    """The sampling settings of the model that writes instructions (the same served model
    as the task's): MIPROv2's prompt model, ``--prompt-max-tokens`` at MIPROv2's own
    proposal temperature; GEPA's reflection LM, as plait's rewriter (``ReflectiveSearch``'s
    temperature 0.7, and plait's default budget for a rewrite of the longest starting
    instruction unless ``--reflection-max-tokens`` is given).  BFSRS writes none."""
    if name == "gepa":
        start = [p.signature.instructions for _, p in program.named_predictors()]
        tokens = args.reflection_max_tokens or reflection_max_tokens(start)
        return {"temperature": args.reflection_temperature, "max_tokens": tokens}
    return {"max_tokens": args.prompt_max_tokens}


def gepa_account(trained: dspy.Module, before: dict[str, int]) -> dict[str, Any]:
    """What GEPA's search did: its candidates and their validation scores, the metric
    calls it spent, and the iterations it had no example to reflect on (`REFLECTIONS`,
    this run's share; ``before``: the counts when it started)."""
    found = trained.detailed_results
    return {
        "reflections_without_examples": REFLECTIONS["no_examples"] - before["no_examples"],
        "gepa": {
            "total_metric_calls": found.total_metric_calls,
            "full_val_evals": found.num_full_val_evals,
            "candidates": len(found.candidates),
            "best": found.best_idx,
            "val_scores": found.val_aggregate_scores,
            "parents": found.parents,
        },
    }


def settings_of(name: str, args: argparse.Namespace) -> dict[str, Any]:
    common = {
        "dspy": dspy.__version__,
        "adapter": args.adapter,
        "task_max_tokens": args.max_tokens,
        "threads": args.threads,
        "max_bootstrapped_demos": 4,
        "max_labeled_demos": 4,
    }
    if name == "bfsrs":
        return common | {"num_candidate_programs": args.candidates}
    if name == "gepa":  # GEPA searches instructions only: it adds no demos
        return {k: v for k, v in common.items() if "demos" not in k} | {
            **gepa_budget(args),
            "reflection_minibatch_size": 3,
            "add_format_failure_as_feedback": args.gepa_format_feedback,
            "instruction_proposer": "InstructionProposer (DSPy's default, JSONAdapter)",
        }
    mipro: dict[str, Any] = {"auto": args.mipro_auto, "prompt_max_tokens": args.prompt_max_tokens}
    if args.mipro_auto == "none":
        mipro |= {"num_candidates": args.mipro_candidates, "num_trials": args.mipro_trials}
    return common | mipro


def key(row: dict[str, Any]) -> tuple[str, str, int]:
    return (row["task"], row["optimizer"], int(row["seed"]))


def store(path: Path, *new: dict[str, Any]) -> list[dict[str, Any]]:
    """``new`` rows merged into the results file (replacing the same task, optimizer
    and seed)."""
    rows: list[dict[str, Any]] = []
    if path.exists():
        rows = json.loads(path.read_text())["runs"]
    if path.resolve() == RESULTS.resolve():  # smoke rows (--limit, --quick) measure nothing
        skipped = [key(row) for row in new if row.get("smoke")]
        if skipped:
            print(f"not stored in {RESULTS.name} (smoke runs): {skipped}", flush=True)
        new = tuple(row for row in new if not row.get("smoke"))
    replaced = {key(row) for row in new}
    rows = [r for r in rows if key(r) not in replaced] + list(new)
    rows.sort(key=lambda r: (TASKS.index(r["task"]), OPTIMIZERS.index(r["optimizer"]), r["seed"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": "benchmarks/dspy_learning.py", "runs": rows}
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| task | optimizer | seed | test start | test end | val end | requests | wall s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['task']}{' (smoke)' if r.get('smoke') else ''} | {r['optimizer_class']} | "
            f"{r['seed']} | {r['test_start']:.0%} | "
            f"{r['test_end']:.0%} | {r['val_end']:.0%} | {r['requests']} | {r['wall_s']:.0f} |"
        )
    lines += [
        "",
        "| task | optimizer | seeds | test end mean (min-max) | val end mean (min-max) "
        "| requests mean (min-max) | wall s mean (min-max) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        task = r["task"] + (" (smoke)" if r.get("smoke") else "")
        groups.setdefault((task, r["optimizer_class"]), []).append(r)

    def spread(values: list[float], fmt: str) -> str:
        return (
            f"{format(statistics.mean(values), fmt)} "
            f"({format(min(values), fmt)}-{format(max(values), fmt)})"
        )

    for (task, optimizer), group in groups.items():
        lines.append(
            f"| {task} | {optimizer} | {len(group)} | "
            f"{spread([r['test_end'] for r in group], '.0%')} | "
            f"{spread([r['val_end'] for r in group], '.0%')} | "
            f"{spread([float(r['requests']) for r in group], '.0f')} | "
            f"{spread([r['wall_s'] for r in group], '.0f')} |"
        )
    return "\n".join(lines)


#: ``--quick``: the smallest budgets the script runs with (a smoke test, not a measurement).
QUICK = {
    "limit": 5,
    "candidates": 1,
    "mipro_candidates": 2,
    "mipro_trials": 2,
    "gepa_budget": 20,
    "gepa_auto": "none",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--server-python", type=Path, default=PLAIT_PYTHON)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--threads", type=int, default=4, help="DSPy's threads = the server's slots"
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=24,
        help="the task model's completion budget (plait's student: 24)",
    )
    parser.add_argument(
        "--prompt-max-tokens",
        type=int,
        default=128,
        help="MIPROv2's prompt model's budget (the same model, writing instructions)",
    )
    parser.add_argument(
        "--gepa-budget",
        type=int,
        default=300,
        help="GEPA's max_metric_calls (examples scored, minibatch and validation alike; "
        "plait's ReflectiveSearch benchmark: 300), with --gepa-auto none",
    )
    parser.add_argument("--gepa-auto", choices=("light", "medium", "heavy", "none"), default="none")
    parser.add_argument(
        "--reflection-temperature",
        type=float,
        default=0.7,
        help="GEPA's reflection LM (the same model): plait's ReflectiveSearch's 0.7",
    )
    parser.add_argument(
        "--reflection-max-tokens",
        type=int,
        default=0,
        help="GEPA's reflection budget; 0: plait's rewriter's default for the task's "
        "longest starting instruction (169-179 tokens here)",
    )
    parser.add_argument(
        "--gepa-format-feedback",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="GEPA's add_format_failure_as_feedback: show the reflection LM the replies "
        "that did not parse (DSPy's default: off, and such replies are left out)",
    )
    parser.add_argument(
        "--adapter",
        choices=("chat", "chat+json", "json"),
        default="chat",
        help="DSPy's adapter: chat (ChatAdapter without its JSON fallback), chat+json "
        "(DSPy's default: ChatAdapter, JSONAdapter after a parse error) or json",
    )
    parser.add_argument("--candidates", type=int, default=3, help="BFSRS num_candidate_programs")
    parser.add_argument(
        "--mipro-auto", choices=("light", "medium", "heavy", "none"), default="none"
    )
    parser.add_argument("--mipro-candidates", type=int, default=3, help="with --mipro-auto none")
    parser.add_argument("--mipro-trials", type=int, default=5, help="with --mipro-auto none")
    parser.add_argument("--limit", type=int, default=0, help="smoke test: first N of each split")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke test, NOT a measurement: the smallest budgets the script runs with "
        f"(--limit {QUICK['limit']} unless given, BFSRS {QUICK['candidates']} candidate, "
        f"MIPROv2 {QUICK['mipro_candidates']} candidates and {QUICK['mipro_trials']} "
        f"trials, GEPA {QUICK['gepa_budget']} metric calls); its rows are marked smoke and "
        "stored only in an --output other than the default results file",
    )
    parser.add_argument(
        "--reuse-start",
        type=Path,
        metavar="JSON",
        help="take the untrained program's test score from this results file when it "
        "holds a run of the task (it is the same program at temperature 0)",
    )
    parser.add_argument(
        "--report",
        type=Path,
        nargs="*",
        metavar="JSON",
        help="run nothing: merge these results files (made with --output) into --output, "
        "then print the table of every run it holds",
    )
    args = parser.parse_args()
    if args.report is not None:
        rows = store(args.output)
        for extra in args.report:
            rows = store(args.output, *json.loads(extra.read_text())["runs"])
        print(table(rows))
        return 0
    if args.quick:
        for name, value in QUICK.items():
            if name != "limit" or not args.limit:
                setattr(args, name, value)
    tasks = args.tasks.split(",")
    optimizers = args.optimizers.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    for task in tasks:
        if task not in TASKS:
            raise SystemExit(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    for name in optimizers:
        if name not in OPTIMIZERS:
            raise SystemExit(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")

    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    with serving(args.server_python, args.threads) as server:
        print(f"model {server.model} served at {server.base}", flush=True)
        task_lm = dspy.LM(
            f"openai/{server.model}",
            api_base=server.base,
            api_key="none",
            temperature=0,
            max_tokens=args.max_tokens,
            cache=False,
        )
        adapter = {
            "chat": lambda: dspy.ChatAdapter(use_json_adapter_fallback=False),
            "chat+json": dspy.ChatAdapter,
            "json": dspy.JSONAdapter,
        }[args.adapter]()
        dspy.configure(lm=task_lm, adapter=adapter, max_errors=10**9)
        rows: list[dict[str, Any]] = []
        for task in tasks:
            tests = len(load(task, "test")[: args.limit or None])
            start = reused_start(args.reuse_start, task, tests) or start_scores(server, task, args)
            print(
                f"{task}: untrained test {start['test_start']:.0%} "
                f"({start['start_requests']} requests, {start['start_wall_s']:.0f} s)",
                flush=True,
            )
            for name in optimizers:
                for seed in seeds:
                    row = run_one(server, task, name, seed, start, args)
                    if row["smoke"] and args.output.resolve() == RESULTS.resolve():
                        rows.append(row)  # printed, not stored: it measures nothing
                    else:
                        rows = store(args.output, row)
                    print(
                        f"{task}/{name}/seed {seed}: test {row['test_start']:.0%} -> "
                        f"{row['test_end']:.0%}, val end {row['val_end']:.0%}, "
                        f"{row['requests']} requests "
                        f"({row['compile_requests']} compiling), {row['wall_s']:.0f} s",
                        flush=True,
                    )
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
