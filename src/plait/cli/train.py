"""``plait train``: improve a pipeline's prompts from a dataset, resumably, with progress.

The command is a thin shell around `plait.learning.trainer.Trainer`: it builds
TARGET the way ``plait run`` does (blueprint ``key=value`` arguments), picks a
loss and an optimizer by name, and writes what a training job leaves behind:
the learned parameter values, the history as JSON and a plot of it.

Resume: the checkpoint lives in ``OUT/checkpoint/`` unless ``--checkpoint`` says
otherwise, and is written after every step.  Re-running the same command after
Ctrl-C (or a crash, or a kill) continues from the last finished step with the
same parameters, optimizer state and position in the data.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import IO, Any

from plait.cli.options import (
    UsageError,
    add_example_arguments,
    add_otel_argument,
    add_resources_argument,
    make_loss,
    needs_target,
    non_negative_float,
    note_embedded,
    otel_handler,
    parse_target_args,
    positive_int,
    report_error,
    target_parser,
)
from plait.cli.progress import Display, RichDisplay, Tally, is_terminal
from plait.module import Module
from plait.ray.cluster import ClusterUnreachable, cluster_address, ensure_ray
from plait.resources.config import ConfigurationError, ResourceConfig
from plait.target import Target, TargetError, code_files

__all__ = ["build_parser", "main"]

OPTIMIZERS = ("sfa", "textgrad", "bootstrap", "search", "reflective", "auto")
#: Files the command writes into --out.
PARAMETERS_FILE = "parameters.json"
HISTORY_JSON = "history.json"
HISTORY_PNG = "history.png"

DESCRIPTION = """\
Train TARGET's learnable Parameters (its prompts) on a dataset of examples.

TARGET is file.py:Name or package.module:Name: a Module class, or a function
that returns a Module.  key=value arguments configure it, as for `plait run`.

Data (--data, --val): JSONL (or CSV) files, one object per line, read as `plait
run` reads its inputs; --target-field (default "target") is passed to the loss
and must be in every example (unless the loss is judge, or --metric scores, and
--target-field is not given).  --input-field NAME is passed to the pipeline; without it, the fields
named like forward's parameters (the target aside) are passed, else the field
"input"; an example that has neither is refused, naming its fields.

Each step trains on a minibatch, lets the optimizer rewrite the prompts, then
scores the validation set: the update is kept only if that score improved, by
at least --min-delta (default: strictly better; a tie restores the previous
prompts too).  --patience N stops after N steps without a kept update.
--test FILE scores a held-out set before the first update and after the last and
prints both.

Losses: exact (output equals target), contains (output contains the target
text(s)), judge (an LLM grades the output against --criteria, with the target as
a reference; its calls use the alias --judge-alias).  Or --metric module:function
(path/to/file.py:function): your function metric(example, prediction) -> bool or
a number in [0, 1] scores each example, as for `plait eval` (see its --help).
Optimizers (--optimizer, repeatable: each step applies them in order and keeps
or rolls back each update on its own): sfa, textgrad (rewrite the instructions;
their LLM calls use the alias --optimizer-alias), bootstrap (sets the
demonstrations of every LLMInference built with demos=[] from the runs that
passed, or from labelled examples while none has; --max-demos per call,
--candidates sets scored on validation per step, --teacher-alias runs the
pipeline on another alias to produce them), search (as bootstrap gathers pairs,
then scores --candidates sets per step (default 16) on a few validation examples,
the better half on twice as many, and so on to all of them; the best is installed
only if it beats the values in place, example by example, and the history
records every candidate's scores and the 95% interval of the gain; with
--instructions N the --optimizer-alias model also writes N new instructions per
learnable system prompt each step, searched together with the demonstrations),
reflective (keeps a pool of candidate instructions and their score on every --val
example; each step draws a parent among the candidates that are best on some
example, in proportion to how many, runs it on the minibatch, and shows the
--optimizer-alias model the examples it failed, with the loss's feedback, to
rewrite one instruction; the new candidate joins the pool only if it beats its
parent on the minibatch, and is then scored on --val; in a pipeline of several
stages, two candidates that improved different stages are merged now and then;
the best on --val is installed after each step).  --max-metric-calls N bounds
what it spends: every example a candidate is scored on counts one, the budget is
never exceeded, and the run ends ("budget") once what is left cannot pay for
another step; with it and no --epochs, the run goes on over as many epochs as
the budget allows.
`--optimizer bootstrap --optimizer sfa` learns both in one run.

--optimizer auto (plait.learning.RecipeSearch) chooses the recipe for this task
instead of you: fixed lists of demonstrations against pools chosen per input
(BM25; embeddings too with --embed ALIAS), each of --k-choices pairs per call
(2,4,8), every label method the label calls' providers run (grammar, logprob,
calibrated on the embedded model and OpenAI-compatible endpoints; grammar on
Anthropic; --label-methods narrows them), and with --instructions N new
instructions by --optimizer-alias.  Each recipe is scored by --folds-fold
cross-validation (5) over --data and --val together, each fold's demonstrations
drawn from the other folds only, by successive halving within --max-calls LLM
requests (600: every call of the runs it scores, a calibrated label call twice,
and every instruction proposal).  The plain fixed list of --max-demos pairs is
searched first: --candidates lists (16) are drawn, each showing every label of a
label call (half of them the others in reverse order: a small model reads the
order too), and halved over the folds, each scored only on examples it holds none
of: all on two folds, the better half on more, the last few on every example
(within half the budget left: fewer lists where it pays for fewer, and fewer than
folds are not searched); a fold is answered by the list chosen without its
examples, and the best of the last few is installed.  Where the pipeline answers
with labels, recipes are compared by balanced accuracy (each label's mean,
averaged), so that answering the majority label of a few dozen examples to
everything does not score as well as telling the labels apart.  The best recipe is
installed only if it beats with support (the 68% paired-bootstrap interval of its
gain, about one standard error, lies above 0) the plain fixed list of --max-demos
pairs (what bootstrap installs) and every simpler recipe; otherwise the tie goes
to the plain list, then to the simplest recipe it does not beat, and that one is
installed (a pool of every labelled pair, or the fixed list that scored best in
cross-validation: for the plain list, of the candidates scored to the end, the one
best on the examples it holds none of); the gate keeps it only if that
cross-validated score beats the values in place on the same examples (not on
--val, now among the demonstrations).  The choice (list or pool, k, the label
method) is saved in parameters.json, so eval, run and serve --parameters use it;
history.json holds every recipe's score on every example, the intervals, the calls
used and why the winner won.  It runs as one step (--max-steps 1 unless given);
alone, not with another --optimizer.

Demonstrations chosen per input: --demos knn [--k N] turns every LLMInference
built with demos into a pool (plait.knn_demos) from which each call is shown
the N pairs most like its input (default 4; by BM25 word overlap, or by the
embeddings of --embed ALIAS, an OpenAI-compatible embedding endpoint); bootstrap
and search fill the
pool with every pair they gather.  --refit: once training ends, every --data and
--val example joins the pools (validation chose how demonstrations are picked;
the final pipeline picks among every labelled example; nothing can score that
step on --val, so give --test to measure it).  --demos list (the default) keeps
one fixed list per call.

Outputs in --out DIR: parameters.json (the learned values, for
module.load_state_dict), history.json (scores per step, kept or rolled back)
and history.png (the curves; needs matplotlib: pip install 'plait[plot]').

Resume: the checkpoint (OUT/checkpoint unless --checkpoint) is written after
every step, and the calls made within a step are logged as they complete;
re-run the same command to continue (Ctrl-C prints it): a killed step pays only
for the calls it had not completed.  What the scores mean and which examples
each step draws must be the same: the data files, the loss (--loss, --criteria,
--judge-alias, --target-field), the models the pipeline and the judge call,
--batch-size, --seed, and the optimizers (in order, with their options such as
--candidates or --max-metric-calls); a resume that changes one is refused, naming
it.  --fresh starts over.

Workers: --workers N runs the minibatches (forward, loss, backward) and the
validation passes on N Ray worker processes with the prompts of the moment (the
same scores and the same calls as one process: bootstrap learns from the runs
the workers send back); the rewrites and the keep-or-roll-back decisions stay in
this process.  --ray-address joins a running cluster instead of starting a
local Ray for the run.

Exit status: 0 done, 1 a call failed (an endpoint down, a refused key), 2 usage
or configuration error, 130 interrupted.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = target_parser(
        "train",
        "plait train TARGET [key=value ...] --data FILE [--val FILE] [options]",
        DESCRIPTION,
    )
    parser.add_argument("--data", metavar="FILE", help="training examples (JSONL)")
    parser.add_argument("--val", metavar="FILE", help="validation examples (JSONL)")
    add_example_arguments(parser)
    parser.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        action="append",
        help="what learns the prompts (sfa); repeat to combine, e.g. bootstrap then sfa",
    )
    parser.add_argument(
        "--max-demos", type=positive_int, default=4, metavar="N", help="bootstrap: pairs per call"
    )
    parser.add_argument(
        "--candidates",
        type=positive_int,
        metavar="N",
        help="bootstrap, search: demonstration sets scored on validation per step (4, 16); "
        "auto: candidate lists searched for the plain list (16)",
    )
    parser.add_argument(
        "--instructions",
        type=positive_int,
        metavar="N",
        help="search: N instructions per system prompt per step, by --optimizer-alias",
    )
    parser.add_argument(
        "--max-metric-calls",
        type=positive_int,
        metavar="N",
        help="reflective: examples its candidates may be scored on in all (no limit)",
    )
    parser.add_argument(
        "--max-calls",
        type=positive_int,
        metavar="N",
        help="auto: LLM requests the choice of recipe may spend (600)",
    )
    parser.add_argument(
        "--folds", type=positive_int, metavar="N", help="auto: cross-validation folds (5)"
    )
    parser.add_argument(
        "--k-choices",
        metavar="LIST",
        help="auto: pairs per call to try, comma-separated (2,4,8)",
    )
    parser.add_argument(
        "--label-methods",
        metavar="LIST",
        help="auto: label methods to try, comma-separated (all the provider runs)",
    )
    parser.add_argument(
        "--demos",
        choices=("list", "knn"),
        default="list",
        help="a fixed list of demonstrations per call, or the k most like each input (list)",
    )
    parser.add_argument(
        "--k", type=positive_int, default=4, metavar="N", help="--demos knn: pairs per call (4)"
    )
    parser.add_argument(
        "--embed",
        metavar="ALIAS",
        help="--demos knn: rank the pool by this alias's embeddings instead of BM25",
    )
    parser.add_argument(
        "--teacher-alias",
        metavar="ALIAS",
        help="bootstrap: run the pipeline on this alias to produce demonstrations",
    )
    parser.add_argument(
        "--optimizer-alias",
        default="optimizer",
        metavar="ALIAS",
        help="the alias the optimizers' own calls use (optimizer)",
    )
    parser.add_argument(
        "--optimizer-max-tokens",
        type=positive_int,
        metavar="N",
        help="cap the length of a rewritten prompt (default: the endpoint's)",
    )
    add_resources_argument(parser)
    add_otel_argument(parser)
    parser.add_argument(
        "--batch-size", type=positive_int, default=4, metavar="N", help="examples per step (4)"
    )
    parser.add_argument(
        "--epochs",
        type=positive_int,
        metavar="N",
        help="passes over --data (1; reflective with --max-metric-calls: until it is spent)",
    )
    parser.add_argument("--patience", type=positive_int, metavar="N", help="early stopping")
    parser.add_argument("--max-steps", type=positive_int, metavar="N", help="stop after N steps")
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="shuffling seed (0)")
    parser.add_argument(
        "--out",
        default="plait-train",
        metavar="DIR",
        help="where the results go: parameters.json, history.json, history.png (plait-train)",
    )
    parser.add_argument(
        "--checkpoint", metavar="DIR", help="checkpoint directory (default: OUT/checkpoint)"
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        metavar="N",
        help="score validation on N Ray worker processes (needs plait[ray])",
    )
    parser.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="join this Ray cluster ('auto': the local one) instead of starting Ray",
    )
    parser.add_argument(
        "--min-delta",
        type=non_negative_float,
        default=0.0,
        metavar="X",
        help="keep an update only if validation improves by X (0: strictly better)",
    )
    parser.add_argument(
        "--test",
        metavar="FILE",
        help="held-out examples (JSONL), scored before and after training",
    )
    parser.add_argument(
        "--refit",
        action="store_true",
        help="--demos knn: add every --data and --val example to the pools once training ends",
    )
    parser.add_argument("--fresh", action="store_true", help="delete the checkpoint; start over")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    parser.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    return parser


def _error(message: str) -> int:
    return report_error("train", message)


def main(argv: list[str]) -> int:
    from plait.learning.failures import TrainerError, TrainingCallFailed

    parser = build_parser()
    ns = parse_target_args(parser, argv)
    if isinstance(ns, int):
        return ns
    if ns.data is None:
        parser.print_usage(sys.stderr)
        return _error("--data FILE is missing: the training examples (JSONL)")
    try:
        return _train(ns, sys.stderr)
    except KeyboardInterrupt:
        print(
            "plait train: interrupted; the last finished step is in the checkpoint. To "
            f"resume, run: {resume_command(argv)}",
            file=sys.stderr,
        )
        return 130
    except TrainingCallFailed as exc:  # the setup was fine; an endpoint failed while running
        return report_error("train", str(exc), status=1)
    except (UsageError, TargetError, ConfigurationError, TrainerError, ClusterUnreachable) as exc:
        return _error(str(exc))


def resume_command(argv: list[str]) -> str:
    """The command that continues this run, ready to paste: the same arguments, without
    --fresh (which would delete the checkpoint the resume needs)."""
    import shlex

    from plait._secrets import scrub

    kept = [arg for arg in argv if arg != "--fresh"]
    return scrub(shlex.join(["plait", "train", *kept]))


def _check_out(ns: argparse.Namespace, out: Path) -> None:
    """Refuse an --out that the results could not be written to, or whose files are
    ones the run reads, before any call is paid for: training ends by writing there."""
    from plait.cli.run import refuse_to_clobber

    if out.exists() and not out.is_dir():
        raise UsageError(
            f"--out {out} is a file; the results (parameters.json, history.json, "
            "history.png) go into a directory: give --out a directory path"
        )
    reads = {"--data": ns.data, "--val": ns.val, "--test": ns.test}
    reads["--resources"] = ns.resources
    for name in (PARAMETERS_FILE, HISTORY_JSON, HISTORY_PNG):
        refuse_to_clobber(reads, {"--out": str(out / name)})
        for path in code_files(ns.target):
            refuse_to_clobber({"TARGET": path}, {"--out": str(out / name)})


def _train(ns: argparse.Namespace, err: IO[str]) -> int:
    from plait.learning.state import json_state, save_parameters
    from plait.learning.trainer import Trainer

    telemetry = otel_handler(ns)  # before anything runs: a missing extra is said at once

    if ns.ray_address is not None or (ns.workers and cluster_address(None)):
        # Joined now, before anything is built or written: a port that answers may
        # still be no Ray head, which only joining tells.
        ensure_ray(ns.ray_address)
    module = Target(ns.target, ns.assignments).make()
    if not any(param.requires_grad for param in module.parameters()):
        raise UsageError(
            f"{ns.target} has no learnable Parameter: give it a plait.Parameter(..., "
            "description=...) (for example as an LLMInference system_prompt) to train"
        )
    try:  # what training ends by writing must be writable, before anything is paid for
        json_state(module)
    except TypeError as exc:
        raise UsageError(
            f"{ns.target} cannot be trained: {exc} (training saves every value in "
            f"{PARAMETERS_FILE})"
        ) from None
    _check_auto_options(ns, ns.optimizer or ["sfa"])
    if ns.refit and ns.val is None:
        raise UsageError(
            "--refit adds every labelled example to the demonstration pools once --val has "
            "chosen how they are picked: give --val"
        )
    auto = "auto" in (ns.optimizer or [])
    if ns.embed is not None and ns.demos != "knn" and not auto:
        raise UsageError(
            "--embed ranks a pool chosen per input: give --demos knn (or --optimizer auto) with it"
        )
    if ns.refit and ns.demos != "knn":
        raise UsageError("--refit grows pools chosen per input: give --demos knn with it")
    train_size = _check_data(ns, module, err)
    epochs = _epochs(ns, train_size)
    if ns.demos == "knn":
        _choose_per_input(ns, module)
    resources: Any = module._bound_resources
    if ns.resources is not None:
        resources = ResourceConfig.load(ns.resources)
    note_embedded("train", module, resources, ns.resources)
    out = Path(ns.out)
    _check_out(ns, out)
    checkpoint = Path(ns.checkpoint) if ns.checkpoint else out / "checkpoint"
    if ns.fresh:
        _remove_checkpoint(checkpoint)
    loss = make_loss(ns, module)
    optimizer = _make_optimizers(ns, module, resources)
    max_steps = ns.max_steps if ns.max_steps is not None or not auto else 1
    display = _Progress(err, ns.quiet)
    trainer = Trainer(
        module,
        loss,
        optimizer,
        ns.data,
        ns.val,
        batch_size=ns.batch_size,
        epochs=epochs,
        patience=ns.patience,
        checkpoint_dir=checkpoint,
        resources=resources,
        seed=ns.seed,
        max_steps=max_steps,
        input_field=ns.input_field,
        target_field=ns.target_field or "target",
        on_event=display.event,
        workers=ns.workers,
        ray_address=ns.ray_address,
        min_delta=ns.min_delta,
        test_data=ns.test,
        refit=ns.refit,
    )
    if trainer.resumed:
        print(
            f"plait train: resuming from {checkpoint} at step {trainer.global_step}",
            file=err,
            flush=True,
        )
    display.start(trainer.total_steps, trainer.global_step)
    try:
        with telemetry:
            history = trainer.fit_sync()
    finally:
        display.stop()
    out.mkdir(parents=True, exist_ok=True)
    save_parameters(module, out / PARAMETERS_FILE)
    history.save(out / HISTORY_JSON)
    written = [PARAMETERS_FILE, HISTORY_JSON]
    try:
        history.plot(out / HISTORY_PNG)
        written.append(HISTORY_PNG)
    except Exception as exc:  # a missing matplotlib must not lose a finished training run
        print(f"plait train: no plot: {exc}", file=err)
    kept = sum(record.kept for record in history.steps)
    print(
        f"plait train: {history.stopped} after {len(history.steps)} step(s) "
        f"({kept} kept); validation {_fmt(history.initial_val_score)} -> "
        f"{_fmt(history.final_val_score)}; wrote {', '.join(written)} to {out}",
        file=err,
    )
    if history.refit:
        grown = ", ".join(f"{name} {a} -> {b}" for name, (a, b) in history.refit["pools"].items())
        print(
            f"plait train: refit on {history.refit['examples']} labelled example(s): "
            f"pools {grown or 'unchanged'}",
            file=err,
        )
    spent = _metric_calls(history)
    if spent is not None:
        print(f"plait train: {spent}", file=err)
    for chooser in optimizer:
        chosen = getattr(chooser, "chosen", None)
        if isinstance(chosen, dict):  # --optimizer auto
            print(
                f"plait train: recipe chosen: {chosen['name']} ({chooser.used} of "
                f"{chooser.max_calls} calls); why, and every recipe's scores: "
                f"{out / HISTORY_JSON}",
                file=err,
            )
    if ns.test is not None:
        print(
            f"plait train: held-out test ({ns.test}): {_fmt(history.initial_test_score)} "
            f"before training -> {_fmt(history.final_test_score)} after",
            file=err,
        )
    if not ns.quiet and history.spend:
        from plait.cli.progress import show

        show(err, history.spend_table())
    return 0


def _epochs(ns: argparse.Namespace, train_size: int) -> int:
    """--epochs, or 1; for a reflective search with a budget and no --epochs, as many
    as the budget could pay for (each step scores at least one example), so that the
    budget, not the data's length, ends the run."""
    if ns.epochs is not None:
        return int(ns.epochs)
    if "reflective" not in (ns.optimizer or ()) or ns.max_metric_calls is None:
        return 1
    size, budget = int(ns.batch_size), int(ns.max_metric_calls)
    batches = -(-train_size // size)
    smallest = min(size, train_size - (batches - 1) * size)
    steps = -(-budget // smallest)  # a step runs its minibatch at least
    return max(1, -(-steps // batches))


def _check_data(ns: argparse.Namespace, module: Module, err: IO[str]) -> int:
    """Read every data file before anything is paid for: a missing input or target
    field is a usage error naming the field and the fields the examples have.  The
    number of training examples is returned."""
    from plait.learning.data import load_examples

    noted: list[str] = []

    def note(text: str) -> None:
        if not noted:  # once for the command, not once per file
            print(f"plait train: {text}", file=err, flush=True)
            noted.append(text)

    sizes = [
        len(
            load_examples(
                data,
                ns.input_field,
                ns.target_field or "target",
                forward=module.forward,
                require_target=needs_target(ns),
                on_unused=note,
            )
        )
        for data in (ns.data, ns.val, ns.test)
        if data is not None
    ]
    return sizes[0]


def _make_optimizers(ns: argparse.Namespace, module: Module, resources: Any) -> list[Any]:
    """The optimizers --optimizer names, in order (sfa when none is named)."""
    from plait.learning import optimizers
    from plait.learning.bootstrap import BootstrapFewShot, demo_parameters
    from plait.learning.reflective import ReflectiveSearch
    from plait.learning.search import DemoSearch

    names = ns.optimizer or ["sfa"]
    _check_auto_options(ns, names)
    if ns.max_metric_calls is not None and "reflective" not in names:
        raise UsageError("--max-metric-calls goes with --optimizer reflective")
    if "auto" in names:
        return [_make_auto(ns, module, resources)]
    learns_demos = {"bootstrap", "search"} & set(names)
    if ns.teacher_alias is not None and not learns_demos:
        raise UsageError("--teacher-alias goes with --optimizer bootstrap or search")
    if ns.candidates is not None and not learns_demos:
        raise UsageError("--candidates goes with --optimizer bootstrap, search or auto")
    if ns.instructions is not None and "search" not in names:
        raise UsageError("--instructions goes with --optimizer search or auto")
    if len(set(names)) != len(names):
        raise UsageError(f"--optimizer names one twice ({', '.join(names)}): name each once")
    if "reflective" in names and (len(names) > 1 or ns.val is None):
        raise UsageError(
            "--optimizer reflective scores its candidates on --val and is the run's only "
            "optimizer: give --val, and no other --optimizer"
        )
    made: list[Any] = []
    for name in names:
        if name == "reflective":
            try:
                search = ReflectiveSearch(
                    module.parameters(),
                    rewriter=ns.optimizer_alias,
                    max_metric_calls=ns.max_metric_calls,
                    seed=ns.seed,
                )
            except ValueError as exc:
                raise UsageError(f"--optimizer reflective: {exc}") from None
            if ns.optimizer_max_tokens is not None:
                search.reflection.max_tokens = ns.optimizer_max_tokens
            made.append(search.bind(resources))
            continue
        if name in ("bootstrap", "search"):
            if not demo_parameters(module.parameters()):
                raise UsageError(
                    f"--optimizer {name}: {ns.target} has no demonstrations to learn; build "
                    "its LLMInference calls with demos=[] (LLMInference(alias, prompt, demos=[]))"
                )
            options: dict[str, Any] = {
                "max_demos": ns.max_demos,
                "candidates": ns.candidates or (4 if name == "bootstrap" else 16),
                "teacher_alias": ns.teacher_alias,
                "seed": ns.seed,
            }
            if name == "bootstrap":
                made.append(BootstrapFewShot(module.parameters(), **options))
                continue
            if ns.instructions is not None:
                options.update(rewriter=ns.optimizer_alias, instructions=ns.instructions)
            try:
                made.append(DemoSearch(module.parameters(), **options).bind(resources))
            except ValueError as exc:
                raise UsageError(f"--optimizer search: {exc}") from None
            continue
        cls = optimizers.SFAOptimizer if name == "sfa" else optimizers.TextGradOptimizer
        optimizer = cls(module.parameters(), alias=ns.optimizer_alias)
        if ns.optimizer_max_tokens is not None:
            optimizer.rewriter.max_tokens = ns.optimizer_max_tokens
        made.append(optimizer.bind(resources))
    return made


def _check_auto_options(ns: argparse.Namespace, names: list[str]) -> None:
    """--optimizer auto runs alone, and its options go with it only."""
    given = [
        flag
        for flag, value in (
            ("--max-calls", ns.max_calls),
            ("--folds", ns.folds),
            ("--k-choices", ns.k_choices),
            ("--label-methods", ns.label_methods),
        )
        if value is not None
    ]
    if "auto" not in names:
        if given:
            raise UsageError(f"{', '.join(given)} go(es) with --optimizer auto")
        return
    if len(names) > 1:
        raise UsageError(
            "--optimizer auto chooses the whole recipe in one step: run it alone, not with "
            f"{', '.join(n for n in names if n != 'auto')}"
        )
    if ns.refit:
        raise UsageError(
            "--refit goes with bootstrap or search: --optimizer auto already fits the recipe "
            "it chooses on every --data and --val example"
        )
    if ns.teacher_alias is not None:
        raise UsageError("--teacher-alias goes with --optimizer bootstrap or search, not auto")


def _make_auto(ns: argparse.Namespace, module: Module, resources: Any) -> Any:
    """--optimizer auto: a `RecipeSearch` with the command's options."""
    from plait.learning.bootstrap import demo_parameters
    from plait.learning.recipes import RecipeSearch

    if not demo_parameters(module.parameters()):
        raise UsageError(
            f"--optimizer auto: {ns.target} has no demonstrations to learn; build its "
            "LLMInference calls with demos=[] (LLMInference(alias, prompt, demos=[]))"
        )
    if ns.embed is not None:  # only pools it tries call it: say so before anything is paid
        from plait.resources.manager import ResourceManager

        config = ResourceManager.coerce(resources).config
        if config and ns.embed not in config:
            raise UsageError(
                f"--embed {ns.embed}: the resources do not configure that alias (they "
                f"configure: {', '.join(sorted(config))}); add it, or name a configured one"
            )
    options: dict[str, Any] = {"max_demos": ns.max_demos, "seed": ns.seed, "embed": ns.embed}
    if ns.max_calls is not None:
        options["max_calls"] = ns.max_calls
    if ns.folds is not None:
        options["folds"] = ns.folds
    if ns.candidates is not None:
        options["lists"] = ns.candidates
    if ns.k_choices is not None:
        options["k_choices"] = _int_list(ns.k_choices, "--k-choices")
    if ns.label_methods is not None:
        options["label_methods"] = [m.strip() for m in ns.label_methods.split(",") if m.strip()]
    if ns.instructions is not None:
        options.update(rewriter=ns.optimizer_alias, instructions=ns.instructions)
    try:
        return RecipeSearch(module.parameters(), **options).bind(resources)
    except ValueError as exc:
        raise UsageError(f"--optimizer auto: {exc}") from None


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated whole numbers, e.g. 2,4,8") from None


def _choose_per_input(ns: argparse.Namespace, module: Module) -> None:
    """--demos knn: every call's demonstrations become a pool of the pairs it holds,
    of which each call is shown the --k most like its input."""
    from plait.demos import is_pool, knn_demos
    from plait.learning.bootstrap import demo_parameters

    held = demo_parameters(module.parameters())
    if not held:
        raise UsageError(
            f"--demos knn: {ns.target} has no demonstrations; build its LLMInference calls "
            "with demos=[] (LLMInference(alias, prompt, demos=[]))"
        )
    for param in held:
        value = param.value
        pool = value["pool"] if is_pool(value) else value
        param.value = knn_demos(k=ns.k, pool=pool, embed=ns.embed)


def _remove_checkpoint(directory: Path) -> None:
    """Delete a trainer checkpoint for --fresh, but never a folder plait did not write."""
    from plait.learning.trainer import CALLS_PREFIX, CHECKPOINT_FILE, SPEND_PREFIX

    if not directory.exists():
        return
    # A run killed before its first checkpoint leaves only its call log and the log of
    # what it paid.
    ours = all(entry.name.startswith((CALLS_PREFIX, SPEND_PREFIX)) for entry in directory.iterdir())
    if not (directory / CHECKPOINT_FILE).exists() and not ours:
        raise UsageError(
            f"--fresh would delete {directory}, which is not a plait trainer checkpoint; "
            "remove it yourself or choose another --checkpoint"
        )
    shutil.rmtree(directory)


def _metric_calls(history: Any) -> str | None:
    """What a budgeted search spent, as its last step reported it (None for others)."""
    for record in reversed(history.steps):
        for trial in record.trials:
            calls = (trial.get("search") or {}).get("metric_calls")
            if isinstance(calls, dict):
                budget = calls.get("budget")
                of = f" of {budget}" if budget is not None else ""
                return f"the search used {calls.get('used')}{of} metric calls"
    return None


def _fmt(score: float | None) -> str:
    return "n/a" if score is None else f"{score:.3f}"


# -- progress ----------------------------------------------------------------------------------
class _StepTally(Tally):
    """`Tally` counting optimizer steps instead of inputs, so `RichDisplay` can draw it."""

    def __init__(self) -> None:
        super().__init__()
        self.kept = 0
        self.rejected = 0
        self.val: float | None = None
        self.best: float | None = None

    def headline(self) -> str:
        total = self.total or 0
        share = f" ({100 * self.finished // total}%)" if total else ""
        return (
            f"step {self.finished}/{total}{share} · val {_fmt(self.val)} (best {_fmt(self.best)})"
        )

    def details(self) -> str:
        from plait.cli.progress import duration

        tokens, cost = self.spend()
        parts = [f"{self.kept} kept", f"{self.rejected} rolled back", f"{tokens:,} tokens"]
        if cost is not None:
            parts.append(f"${cost:.4f}")
        parts.append(f"elapsed {duration(self.elapsed())}")
        return " · ".join(parts)


class _Progress:
    """A live bar on a terminal; otherwise one line per step (steps are slow, lines are few)."""

    def __init__(self, stream: IO[str], quiet: bool) -> None:
        self.stream = stream
        self.quiet = quiet
        self.tally = _StepTally()
        self.display: Display | None = None

    def start(self, total: int, done: int) -> None:
        self.tally.total = total
        self.tally.succeeded = done
        if not self.quiet and is_terminal(self.stream):
            self.display = RichDisplay(self.tally, self.stream)
            self.display.start()

    def stop(self) -> None:
        if self.display is not None:
            self.display.stop()

    def event(self, event: Any) -> None:
        tally = self.tally
        tally.total = event.total_steps
        tally.succeeded = event.step
        tally.best = event.history.best_val_score
        record = event.record
        if event.kind == "validated":
            tally.val = event.history.initial_val_score
        elif record is not None:
            tally.val = record.val_score
            if record.kept:
                tally.kept += 1
            else:
                tally.rejected += 1
        if self.quiet or self.display is not None or event.kind not in ("validated", "step"):
            return
        if record is None:
            line = f"initial validation score {_fmt(tally.val)}"
        else:
            verdict = "kept" if record.kept else "rolled back"
            # A step whose optimizer ran no minibatch (auto) has no batch score to show.
            batch = (
                "" if record.train_score is None else f" · batch score {_fmt(record.train_score)}"
            )
            line = (
                f"{tally.headline()}{batch} · {verdict}"
                f" · changed: {', '.join(record.changed) or 'nothing'}"
            )
        print(f"plait train: {line}", file=self.stream, flush=True)
