"""``plait eval``: score a pipeline on a dataset: the mean, a 95% interval, the failures,
and for a classification a confusion table (`plait.learning.confusion`).

TARGET is built as ``plait run`` builds it, optionally with the values ``plait
train`` learned (``--parameters``); each example runs through the pipeline and
the loss in eval mode (a `TrainingStep`, as the trainer's validation does).  A
pipeline error scores 0 and is counted and reported, never dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from pathlib import Path
from typing import IO, Any

from plait.cli.options import (
    UsageError,
    add_example_arguments,
    add_otel_argument,
    add_parameters_argument,
    add_resources_argument,
    make_loss,
    needs_target,
    note_embedded,
    otel_handler,
    parse_target_args,
    report_error,
    seed_value,
    target_parser,
)
from plait.cli.parameters import ParametersError, load_parameters
from plait.cli.progress import Display, Tally, make_display
from plait.learning.confusion import (
    FAILED,
    MAX_LABEL_CHARS,
    MAX_LABELS,
    Confusion,
    NotLabels,
    confusion,
    find_labels,
)
from plait.learning.step import Inputs, TrainingStep, loss_call, model_call
from plait.module import Module
from plait.resources.config import ConfigurationError, ResourceConfig
from plait.target import Target, TargetError, code_files

__all__ = ["build_parser", "confidence_interval", "main"]

#: Failed examples quoted in the summary.
ERRORS_SHOWN = 3
#: The two-sided 95% normal quantile.
Z95 = 1.959963984540054

DESCRIPTION = f"""\
Score TARGET on a dataset: run every example through the pipeline and the loss
(in eval mode), then print the mean score, the number of examples and a 95%
confidence interval of the mean.

TARGET is file.py:Name or package.module:Name; key=value arguments configure it,
as for `plait run`.  --parameters FILE loads the values `plait train` learned
(its parameters.json); names the file does not set keep their defaults.

Data (--data): a JSONL (or CSV) file, one object per line, read as `plait run`
reads its inputs; --target-field (default "target") is passed to the loss, and
must be in every example (its absence is an error naming the fields, unless the
loss is judge, or --metric scores, and --target-field is not given).  --input-field NAME is passed
to the pipeline; without it, the fields named like forward's parameters (the
target aside) are passed, else the field "input"; an example that has neither
is refused, naming its fields.  An input that is a list is one input.

Losses: exact (output equals target), contains (output contains the
target text(s)), judge (an LLM grades the output against --criteria; its calls
use the alias --judge-alias).  Scores lie in [0, 1].

Metric: --metric module:function (or path/to/file.py:function) scores each
example with your function instead of a loss, metric(example, prediction), as
DSPy's metrics are written (a third parameter, DSPy's trace, is given None).
example holds the example's input field(s) and its target field, read as
example["label"] or example.label; prediction is what the pipeline returned.
It returns a bool (1 or 0) or a number in [0, 1].  A metric that raises, or
returns anything else, makes that example a failed one, its error naming the
metric; a reference that cannot be imported, or a function that cannot take
(example, prediction), is refused before any example runs (exit 2).

Interval: when every score is 0 or 1, the Wilson score interval (sound for a
proportion, even near 0 or 1 and for few examples); otherwise the normal
approximation, mean +- 1.96 * standard error (sample standard deviation /
sqrt(n)), clipped to [0, 1].

A pipeline error scores 0: it is counted in the mean and reported (how many,
and the first few), never dropped.  --output FILE writes one JSON line per
example, {{"index", "input", "target", "output", "score"}} (and "error" for a
failed one), so the misses can be read.

Labels: when the task is a classification (every target a text or an integer
on one line, of at most {MAX_LABEL_CHARS} characters; 2 to {MAX_LABELS} distinct targets,
some of them on two examples or more), a confusion table follows the mean: a
row per true label, a column per predicted label, (other) for answers that are
none of the labels, (error) for failed examples, and each label's support,
precision, recall and F1; then the accuracy and the macro-F1 (the mean of the
labels' F1).  Whatever --loss is, an answer is compared with the labels as
--loss exact compares it (an Enum as its value; case, surrounding and repeated
whitespace ignored), and labels are shown so, sorted.  A label never answered
has precision 0.  --labels shows the table for any targets (every example must
have one); --no-labels never shows it.

--report FILE writes the result as one JSON object: {{"examples", "mean",
"interval": {{"low", "high", "method"}}, "failed", "confusion"}}; "confusion" is
null without a table, else {{"labels", "rows": [{{"label", "predicted": {{LABEL:
count}}, "other", "errors", "support", "precision", "recall", "f1"}}],
"examples", "correct", "accuracy", "macro_f1"}}.

A pipeline whose first example cannot be traced is refused before any example
is run (exit 2), as plait run does.

Exit status: 0 every example scored, 1 some example failed with an error (the
mean and the failures are still printed), 2 usage or configuration error, 130
interrupted.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = target_parser(
        "eval",
        "plait eval TARGET [key=value ...] --data FILE [--loss {exact,contains,judge} | "
        "--metric MODULE:FUNCTION] [options]",
        DESCRIPTION,
    )
    parser.add_argument("--data", metavar="FILE", help="examples to score (JSONL)")
    add_example_arguments(parser)
    add_resources_argument(parser)
    add_otel_argument(parser)
    add_parameters_argument(parser)
    parser.add_argument(
        "--seed",
        type=seed_value,
        metavar="N",
        help="run seed for sampled calls: the same seed scores the same samples",
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="one JSON line per example")
    parser.add_argument(
        "--report", metavar="FILE", help="the result as JSON (mean, interval, confusion)"
    )
    parser.add_argument(
        "--labels",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the confusion table: always, or never (default: for a classification)",
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="no progress display: errors and the result"
    )
    parser.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    return parser


def _error(message: str) -> int:
    return report_error("eval", message)


def main(argv: list[str]) -> int:
    from plait.learning.failures import TrainerError

    parser = build_parser()
    ns = parse_target_args(parser, argv)
    if isinstance(ns, int):
        return ns
    if ns.data is None:
        parser.print_usage(sys.stderr)
        return _error("--data FILE is missing: the examples to score (JSONL)")
    try:
        return _eval(ns, sys.stdout, sys.stderr)
    except (
        UsageError,
        TargetError,
        ConfigurationError,
        TrainerError,
        ParametersError,
    ) as exc:
        return _error(str(exc))


def confidence_interval(scores: list[float]) -> tuple[float, float, str]:
    """A 95% interval of the mean of ``scores`` (in [0, 1]) and the method's name."""
    n = len(scores)
    mean = sum(scores) / n
    if all(score in (0.0, 1.0) for score in scores):
        z2 = Z95 * Z95
        centre = (mean + z2 / (2 * n)) / (1 + z2 / n)
        half = Z95 * math.sqrt(mean * (1 - mean) / n + z2 / (4 * n * n)) / (1 + z2 / n)
        return max(0.0, centre - half), min(1.0, centre + half), "Wilson"
    variance = sum((s - mean) ** 2 for s in scores) / (n - 1) if n > 1 else 0.0
    half = Z95 * math.sqrt(variance / n)
    return max(0.0, mean - half), min(1.0, mean + half), "normal approximation"


def _eval(ns: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    from plait.cli.run import refuse_to_clobber
    from plait.learning.data import load_examples

    telemetry = otel_handler(ns)  # before anything runs: a missing extra is said at once

    refuse_to_clobber(
        {
            "--data": ns.data,
            "--parameters": ns.parameters,
            "--resources": ns.resources,
        },
        {"--output": ns.output, "--report": ns.report},
    )
    for path in code_files(ns.target):
        refuse_to_clobber({"TARGET": path}, {"--output": ns.output, "--report": ns.report})
    refuse_to_clobber({"--output": ns.output}, {"--report": ns.report})
    module = Target(ns.target, ns.assignments).make()
    if ns.parameters is not None:
        load_parameters(module, ns.parameters, "eval", err)
    target_field = ns.target_field or "target"
    examples = load_examples(
        ns.data,
        ns.input_field,
        target_field,
        forward=module.forward,
        require_target=needs_target(ns),
        on_unused=lambda note: print(f"plait eval: {note}", file=err, flush=True),
    )
    if not examples:
        raise UsageError(f"--data {ns.data} holds no examples")
    loss = make_loss(ns, module)
    resources: Any = module._bound_resources
    if ns.resources is not None:
        resources = ResourceConfig.load(ns.resources)
    note_embedded("eval", module, resources, ns.resources)
    labels = _labels(ns.labels, [target for _, target in examples])
    for flag, path in (("--output", ns.output), ("--report", ns.report)):
        if path is not None and (Path(path).is_dir() or not Path(path).parent.is_dir()):
            raise UsageError(f"cannot write {flag} {path}: give a file in an existing folder")
    step = _ScoredStep(module, loss)
    _trace_first(ns.target, module, examples)
    tally = Tally(len(examples))
    display = make_display(tally, err, quiet=ns.quiet, command="eval")
    display.start()
    try:
        with telemetry:
            rows = asyncio.run(_score_all(step, examples, resources, ns.seed, tally, display))
    finally:
        display.stop()
    if ns.output is not None:
        try:
            with Path(ns.output).open("w", encoding="utf-8") as writer:
                for row in rows:
                    writer.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        except OSError as exc:
            raise UsageError(f"cannot write --output {ns.output} ({exc.strerror or exc})") from None
    scores = [row["score"] for row in rows]
    low, high, method = confidence_interval(scores)
    mean = sum(scores) / len(scores)
    failed = [row for row in rows if "error" in row]
    print(
        f"mean {mean:.4f} over {len(rows)} example(s); 95% CI [{low:.4f}, {high:.4f}] ({method})",
        file=out,
    )
    table = None
    if labels is not None:
        pairs = ((row["target"], FAILED if "error" in row else row["output"]) for row in rows)
        table = confusion(pairs, labels)
        _print_confusion(table, out)
    if ns.report is not None:
        summary = {
            "examples": len(rows),
            "mean": mean,
            "interval": {"low": low, "high": high, "method": method},
            "failed": len(failed),
            "confusion": None if table is None else table.as_json(),
        }
        _write_report(ns.report, summary)
    if failed:
        print(
            f"plait eval: {len(failed)} of {len(rows)} example(s) failed and scored 0:",
            file=err,
        )
        for row in failed[:ERRORS_SHOWN]:
            print(f"  example {row['index']}: {row['error']}", file=err)
        if len(failed) > ERRORS_SHOWN:
            print(f"  ... and {len(failed) - ERRORS_SHOWN} more", file=err)
    if ns.output is not None:
        print(f"plait eval: wrote one line per example to {ns.output}", file=err)
    if ns.report is not None:
        print(f"plait eval: wrote the result to {ns.report}", file=err)
    # As `plait run`: a mean over examples that failed (an endpoint refusing every
    # request) is not a score of the pipeline, so a script must be able to tell.
    return 1 if failed else 0


def _labels(choice: bool | None, targets: list[Any]) -> list[str] | None:
    """The labels the confusion table has, or None for no table: ``choice`` is
    --labels (True), --no-labels (False) or neither (None: the data decides).  Decided
    before any example runs, so a forced table the targets cannot make costs nothing."""
    if choice is False:
        return None
    try:
        return find_labels(targets, force=bool(choice))
    except NotLabels as exc:
        if choice:
            raise UsageError(f"--labels: {exc}") from None
        return None


def _print_confusion(table: Confusion, out: IO[str]) -> None:
    """The confusion table, then the accuracy and macro-F1 lines, on ``out``."""
    from rich.table import Table
    from rich.text import Text

    from plait.cli.progress import show

    grid = Table(
        title="confusion: true label (rows) by answer (columns)",
        caption="(other): none of the labels; (error): the example failed",
    )
    # Text, not markup: a label such as "[x]" is shown as written.
    grid.add_column(Text("true label"), overflow="fold")
    for header in [*table.labels, "(other)", "(error)", "support"]:
        grid.add_column(Text(header), justify="right", overflow="fold")
    for header in ("precision", "recall", "F1"):
        grid.add_column(header, justify="right")
    for row in table.rows:
        cells = [row.predicted[label] for label in table.labels]
        cells += [row.other, row.errors, row.support]
        scores = (row.precision, row.recall, row.f1)
        grid.add_row(Text(row.label), *(str(n) for n in cells), *(f"{x:.4f}" for x in scores))
    show(out, grid)  # in a log or a pipe: rows a reader can parse, never wrapped
    print(
        f"accuracy {table.accuracy:.4f} ({table.correct} of {table.examples} example(s))",
        file=out,
    )
    print(f"macro-F1 {table.macro_f1:.4f} over {len(table.rows)} label(s)", file=out)


def _write_report(path: str, summary: dict[str, Any]) -> None:
    from plait._files import write_atomic

    try:
        write_atomic(path, json.dumps(summary, ensure_ascii=False, indent=2) + "\n")
    except OSError as exc:
        raise UsageError(f"cannot write --report {path} ({exc.strerror or exc})") from None


def _trace_first(spec: str, module: Module, examples: list[Any]) -> None:
    """Trace the first example before any is paid for, as `plait run` does: a
    `TracingError` there is the pipeline's code, wrong for every example alike, so it
    is one usage error rather than a score of 0 and one error line per example."""
    from plait.execution.runtime import traced_first
    from plait.tracing.tracer import TracingError

    def prepare(example: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        input = example[0]
        return ((), dict(input)) if isinstance(input, Inputs) else ((input,), {})

    try:
        traced_first(module, examples[:1], prepare)
    except TracingError as exc:
        raise UsageError(
            f"{spec} cannot be traced, so no example was run and nothing was paid for: {exc}"
        ) from None


class _ScoredStep(TrainingStep):
    """A `TrainingStep` that also hands back the model's output, for --output."""

    def forward(self, input: Any, target: Any = None) -> Any:
        output = model_call(self.model, input)
        return {"output": output, "feedback": loss_call(self.loss_fn, output, target, input)}


async def _score_all(
    step: _ScoredStep,
    examples: list[Any],
    resources: Any,
    seed: int | None = None,
    tally: Tally | None = None,
    display: Display | None = None,
) -> list[dict[str, Any]]:
    from plait.execution.runtime import call_single
    from plait.execution.settings import ExecutionSettings
    from plait.resources.manager import ResourceManager
    from plait.sampling import fold

    step.eval()
    tally = tally if tally is not None else Tally(len(examples))

    async def one(index: int, input: Any, target: Any) -> dict[str, Any]:
        row: dict[str, Any] = {"index": index, "input": input, "target": target}
        # Each example is a run of its own, at position 0: its run seed takes the
        # example's position, so examples draw distinct samples as rows of `plait run` do.
        options = {} if seed is None else {"seed": fold(seed, "eval example", index)}
        tally.in_flight += 1
        try:
            # one example, even when its input is a list (as plait train calls it)
            result = await call_single(step, (input,), {"target": target, **options})
        except Exception as exc:  # a pipeline or loss error scores 0, and is reported
            row.update(output=None, score=0.0, error=f"{type(exc).__name__}: {exc}")
            tally.failed += 1
        else:
            row.update(output=_plain(result["output"]), score=_score(result["feedback"]))
            tally.succeeded += 1
        finally:
            tally.in_flight -= 1
            if display is not None:
                display.changed()
        return row

    async with ExecutionSettings(resources=ResourceManager.coerce(resources), seed=seed):
        return list(
            await asyncio.gather(
                *(one(index, input, target) for index, (input, target) in enumerate(examples))
            )
        )


def _plain(value: Any) -> Any:
    from plait.values import Value

    while isinstance(value, Value):
        value = value.payload
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return value


def _score(feedback: Any) -> float:
    from plait.learning.feedback import Feedback

    payload = _plain(feedback)
    if isinstance(payload, Feedback):
        return payload.score
    if isinstance(payload, int | float) and not isinstance(payload, bool):
        return float(payload)
    raise UsageError(f"the loss returned a {type(payload).__name__}, not a Feedback with a score")
