"""`Trainer`: minibatch prompt training that only keeps updates validation agrees with.

A textual update is a guess: an optimizer rewrites a prompt from a handful of
feedback texts, and the rewrite can as easily make the pipeline worse as better.
So the trainer measures before it commits.  Each step it

1. runs a minibatch through ``TrainingStep(model, loss_fn)`` in ``train()`` mode
   and sends every loss's feedback back into the parameters (example by example,
   in the minibatch's order);
2. lets the optimizer rewrite them (an optimizer that learns from runs rather
   than feedback, `BootstrapFewShot`, is shown the minibatch's traces first);
3. scores the validation set (mean `Feedback` score, eval mode) and keeps the
   update only if that score improved (see below), restoring the previous values
   otherwise.  Given a list of optimizers (``[BootstrapFewShot(...),
   SFAOptimizer(...)]``) the trainer does 2 and 3 for each in turn, so each
   update is kept or rolled back on its own merit;
4. writes a checkpoint (parameters, optimizer state, history and the position in
   the data) so a killed run resumes where it was, not from the start.  The
   history records, per step, the values each optimizer tried, their validation
   scores, what was kept, and the requests and tokens the step spent.

An update is kept only when validation scores better than the best so far, by at
least ``min_delta`` (default: strictly better); a tie keeps the values already
proven, so a run never ends with values validation scored worse than where it
started.  Training stops early after ``patience`` steps without a kept update.
With ``test_data`` (``plait train --test FILE``) a held-out set is scored before
the first update and after the last, so what training did is reported on data
it chose nothing by.  Without a validation set every update is kept and there is
no early stopping: there is nothing to judge an update by.

Data is a list of ``(input, target)`` pairs, a list of mappings with an input and
a target field, or a path to a JSONL file of such mappings (`load_examples`).
Minibatches are drawn from a permutation seeded by ``seed`` and the epoch, so a
resumed run draws exactly the batches the killed one would have.

With ``workers=N`` (or ``ray_address=``) the minibatches' forward and backward
passes and the validation passes run on Ray worker processes (`plait.ray`); the
optimizer's rewrites and the decisions stay in this process.  See `Trainer` for
what runs where.

This module is the loop.  What it reads, writes and reports lives beside it, one
job to a module: the data (`plait.learning.data`), the history and its JSON
(`plait.learning.history`), its plot (`plait.learning.plot`), what makes a run
the same run on resume (`plait.learning.identity`) and the errors
(`plait.learning.failures`).  Their public names are importable from here too.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import random
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plait._digest import digest
from plait._files import write_atomic
from plait.demos import is_pool
from plait.effects import Message
from plait.execution.backends import TrainingBackend, backend
from plait.execution.checkpoint import CheckpointHandler
from plait.learning.backward import Received, receive
from plait.learning.bootstrap import ExampleRun, Trace, TrainingBatch, trace_from_rows
from plait.learning.data import Example, load_examples
from plait.learning.failures import (
    TrainerError,
    TrainingCallFailed,
    optimizer_call_failure,
    training_call_failure,
)
from plait.learning.feedback import Feedback
from plait.learning.history import Judgement, StepRecord, TrainingHistory, Trial
from plait.learning.identity import check_resume, run_identity
from plait.learning.identity import describe_loss as describe_loss  # public here before the split
from plait.learning.identity import loss_changes as loss_changes  # public here before the split
from plait.learning.plot import plot_history
from plait.learning.step import TrainingStep
from plait.module import Module
from plait.providers.base import LLMRequest
from plait.sampling import rng_parameter_names
from plait.values import Value, kind_of

__all__ = [
    "CALLS_PREFIX",
    "CHECKPOINT_FILE",
    "HISTORY_FILE",
    "StepRecord",
    "Trainer",
    "TrainerError",
    "TrainingCallFailed",
    "TrainingEvent",
    "TrainingHistory",
    "Trial",
    "load_examples",
    "plot_history",
]

#: The trainer's state inside ``checkpoint_dir``.
CHECKPOINT_FILE = "trainer.json"
#: The scores so far, beside the checkpoint (the same history, readable on its own).
HISTORY_FILE = "history.json"
#: Directories ``calls-<step>`` in ``checkpoint_dir`` log the calls completed since
#: that step's checkpoint (see `Trainer._call_log`).
CALLS_PREFIX = "calls-"
#: Bumped when the checkpoint's layout changes, so an old one is refused, not misread.
CHECKPOINT_FORMAT = "plait-trainer/1"


# -- progress ----------------------------------------------------------------------------------
@dataclass(slots=True)
class TrainingEvent:
    """What the trainer tells a progress display: a kind and where the run is.

    A `Trainer`'s ``on_event`` callback receives one at each of these moments.

    Attributes:
        kind: ``"resumed"`` (state loaded from a checkpoint), ``"validated"`` (the
            initial validation pass), ``"step"`` (a step finished; ``record`` says
            how) or ``"stopped"`` (the run ended; ``history.stopped`` says why).
        step: The steps done so far.
        total_steps: The steps the run will make at most.
        history: The run's history so far.
        record: The step's record, for a ``"step"`` event.
    """

    kind: str
    step: int
    total_steps: int
    history: TrainingHistory
    record: StepRecord | None = None


# -- the trainer -------------------------------------------------------------------------------
class Trainer:
    """Trains a pipeline's prompts and demonstrations, keeping only updates validation agrees with.

    A textual update is a guess: a rewrite can as easily make the pipeline worse
    as better, so the trainer measures before it commits.  Each step it runs a
    minibatch through the pipeline and the loss in ``train()`` mode, sends the
    feedback back into the parameters, lets the optimizer rewrite them, then
    scores the validation set and keeps the update only if that score improved
    (by at least ``min_delta``; a tie keeps the values already proven), restoring
    the previous values otherwise.  So a run never ends with values validation
    scored worse than where it started.  With a list of optimizers each one's
    update is kept or rolled back on its own merit.  Without a validation set
    every update is kept.  After each step it writes a checkpoint (with
    ``checkpoint_dir``), so a killed run resumes where it was.

    Data is a list of ``(input, target)`` pairs, a list of mappings with an input
    and a target field, or a path to a JSONL or CSV file of such mappings (read as
    ``plait train`` reads it).

    Args:
        model: The pipeline to train.
        loss_fn: A loss module returning `Feedback` (see `plait.learning.losses`).
        optimizer: An optimizer built over ``model.parameters()`` (and bound to
            the resources its own LLM calls should use), or a list of them,
            applied in order at each step.
        train_data: The training examples.
        val_data: The validation examples that judge each update (None: every
            update is kept and there is no early stopping).
        batch_size: Examples per minibatch (one optimizer step each).
        epochs: Passes over the training data.
        patience: Stop after this many steps without a kept update (None: never).
        checkpoint_dir: Where to keep the checkpoint, ``history.json`` and the
            log of completed calls; a new Trainer over the same directory
            continues from its last finished step.
        resources: Where the pipeline's and the loss's calls go (default: what
            ``model`` is bound to, else the embedded local model).
        seed: Fixes the minibatches' order, so a resumed run draws the same batches.
        shuffle: Shuffle the training data each epoch.
        max_steps: Cap on the total number of optimizer steps, across resumes.
        input_field: The input field of mapping examples (default: the fields
            named like ``forward``'s parameters, else ``input``).
        target_field: The target field of mapping examples.
        on_event: Called with a `TrainingEvent` at each milestone, for progress displays.
        workers: Run the minibatches and validation passes on this many Ray
            worker processes (see below).
        ray_address: Join a running Ray cluster (``"auto"`` for the local one).
        min_delta: How much validation must improve for an update to be kept
            (0: strictly better).
        test_data: Held-out examples scored before the first update and after
            the last (``history.initial_test_score``, ``final_test_score``).
        refit: Once training has ended, add the pairs of every labelled example
            (training and validation) to the demonstration pools chosen per input
            (``demos=knn_demos(...)``), so the final pipeline picks among all of
            them; recorded in ``history.refit``, measured by ``test_data``.

    Raises:
        ValueError: ``min_delta`` is not a number >= 0, or ``batch_size``,
            ``epochs``, ``patience``, ``max_steps`` or ``workers`` is not a
            positive integer.
        TrainerError: A data set is empty, ``refit`` lacks what it needs
            (validation data, a pool, an optimizer that gathers demonstrations),
            or ``checkpoint_dir`` holds a checkpoint of another run or one that
            cannot be read.
        TypeError: ``refit`` is not a bool, or an optimizer has no ``step()`` or
            ``zero_feedback()``.

    With ``workers=N`` the minibatches and the validation passes run on N Ray
    worker processes (``ray_address`` joins a running cluster; without it a local
    Ray is started if none is running, and `fit` stops the one it started).  Each
    worker runs the pipeline, the loss and the backward pass for its examples and
    sends back the outputs, the feedback each parameter received and the calls
    made; each pass ships the parameter values of that moment, and the
    endpoints' limits hold for the cluster as a whole.  The optimizer's rewrites,
    the keep-or-roll-back decision, early stopping and the checkpoint stay in
    this process.  The results are the same as in one process (the same calls,
    the same feedback in the same order); ``workers`` does not enter the
    checkpoint, so a run may be resumed with or without them.  One difference: a
    backward pass that fails on a worker stops the run with a `TrainerError`
    naming the failure, where in one process the exception itself propagates.

    Examples:
        ```python
        import asyncio

        import plait
        from plait.handlers import mock
        from plait.learning import BootstrapFewShot, ExactMatch, Trainer
        from plait.providers import LLMRequest


        class Triage(plait.Module):
            def __init__(self) -> None:
                super().__init__()
                self.classify = plait.LLMInference(
                    "fast", "Is the message about billing or shipping?", demos=plait.knn_demos(k=2)
                )

            def forward(self, message: str) -> str:
                return self.classify(message)


        def model(request: LLMRequest) -> str:
            # A stand-in model that answers as the demonstration next to the input.
            answers = [m["content"] for m in request.messages if m["role"] == "assistant"]
            return answers[-1] if answers else "unsure"


        train = [
            ("I was charged twice this month.", "billing"),
            ("My parcel has not arrived.", "shipping"),
            ("Why is there a second payment on my card?", "billing"),
            ("The tracking page has not changed in a week.", "shipping"),
        ]
        val = [("My card was charged twice.", "billing"), ("Where is my parcel?", "shipping")]
        test = [("A second payment appeared on my card.", "billing")]

        pipeline = Triage()
        optimizer = BootstrapFewShot(pipeline.parameters())
        trainer = Trainer(
            pipeline, ExactMatch(), optimizer, train, val, batch_size=2, checkpoint_dir="runs/t"
        )
        with mock({"fast": model}):
            history = trainer.fit_sync()
            print(history.initial_val_score, "->", history.best_val_score, f"({history.stopped})")
            print("test score:", asyncio.run(trainer.evaluate(test)))
        ```
    """

    def __init__(
        self,
        model: Module,
        loss_fn: Module,
        optimizer: Any,
        train_data: str | os.PathLike[str] | Iterable[Any],
        val_data: str | os.PathLike[str] | Iterable[Any] | None = None,
        *,
        batch_size: int = 4,
        epochs: int = 1,
        patience: int | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        resources: Any = None,
        seed: int = 0,
        shuffle: bool = True,
        max_steps: int | None = None,
        input_field: str | None = None,
        target_field: str = "target",
        on_event: Callable[[TrainingEvent], None] | None = None,
        workers: int | None = None,
        ray_address: str | None = None,
        min_delta: float = 0.0,
        test_data: str | os.PathLike[str] | Iterable[Any] | None = None,
        refit: bool = False,
    ) -> None:
        if (
            isinstance(min_delta, bool)
            or not isinstance(min_delta, int | float)
            or not math.isfinite(min_delta)
            or min_delta < 0
        ):
            raise ValueError(f"min_delta must be a number >= 0, got {min_delta!r}")
        for name, value in (("batch_size", batch_size), ("epochs", epochs)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name, limit in (
            ("patience", patience),
            ("max_steps", max_steps),
            ("workers", workers),
        ):
            if limit is not None and (not isinstance(limit, int) or limit < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {limit!r}")
        self.model = model
        self.loss_fn = loss_fn
        self.optimizers: list[Any] = _optimizer_list(optimizer)
        """The optimizers, in the order each step applies (and judges) their updates."""
        self.optimizer = self.optimizers[0]
        self.train_data = load_examples(
            train_data, input_field, target_field, forward=model.forward
        )
        if not self.train_data:
            raise TrainerError("the training set is empty: give at least one example")
        self.val_data = (
            load_examples(val_data, input_field, target_field, forward=model.forward)
            if val_data is not None
            else None
        )
        if self.val_data is not None and not self.val_data:
            raise TrainerError("the validation set is empty: give examples, or val_data=None")
        self.test_data = (
            load_examples(test_data, input_field, target_field, forward=model.forward)
            if test_data is not None
            else None
        )
        if self.test_data is not None and not self.test_data:
            raise TrainerError("the test set is empty: give examples, or test_data=None")
        if not isinstance(refit, bool):
            raise TypeError(f"refit must be True or False, got {refit!r}")
        if refit:
            _check_refit(model, self.optimizers, self.val_data)
        self.refit = refit
        """Grow the demonstration pools by every labelled example once training ends."""
        self.min_delta = float(min_delta)
        """How much validation must improve for an update to be kept (0: strictly better)."""
        self.batch_size = batch_size
        self.epochs = epochs
        self.patience = patience
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.resources = resources if resources is not None else model._binding()[0]
        self.seed = seed
        self.shuffle = shuffle
        self.max_steps = max_steps
        self.on_event = on_event
        self.workers = workers
        self.ray_address = ray_address
        self.step_module = TrainingStep(model, loss_fn)
        """The pipeline and its loss as one module, as each pass runs them."""
        self.history = TrainingHistory()
        """The run's history so far (loaded with the checkpoint when resuming)."""
        self.epoch = 0
        """The epoch of the next batch to train on, from 0."""
        self.batch_index = 0
        """The next batch's position in its epoch."""
        self.global_step = 0
        """Optimizer steps taken so far, across resumes."""
        self.stale_steps = 0
        """Steps since validation last improved (for ``patience``)."""
        #: The resources of the `fit` under way (None outside one).
        self._manager: Any = None
        #: The handler answering calls from the current position's call log, in a `fit`
        #: with a ``checkpoint_dir`` (see `_call_log`).
        self._calls: Any = None
        self.resumed = self._load_checkpoint()
        """Whether a checkpoint in ``checkpoint_dir`` was loaded, to continue its run."""

    # -- sizes ---------------------------------------------------------------------------
    @property
    def batches_per_epoch(self) -> int:
        """Minibatches in one pass over the training data."""
        return math.ceil(len(self.train_data) / self.batch_size)

    @property
    def total_steps(self) -> int:
        """Steps a full run takes (fewer if it stops early), for progress displays."""
        total = self.epochs * self.batches_per_epoch
        return min(total, self.max_steps) if self.max_steps is not None else total

    def batches(self, epoch: int) -> list[list[Example]]:
        """The epoch's minibatches, drawn so that a resumed run draws the same ones.

        Args:
            epoch: The epoch, from 0.

        Returns:
            The minibatches, from a permutation fixed by ``seed`` and ``epoch``.
        """
        order = list(range(len(self.train_data)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
        examples = [self.train_data[i] for i in order]
        return [
            examples[start : start + self.batch_size]
            for start in range(0, len(examples), self.batch_size)
        ]

    # -- running -------------------------------------------------------------------------
    def fit_sync(self) -> TrainingHistory:
        """`fit` from synchronous code (a script, a notebook cell).

        Returns:
            The run's history.

        Raises:
            TrainerError: As `fit`.
        """
        from plait.execution.loop import run_blocking

        return run_blocking(self.fit())

    async def fit(self) -> TrainingHistory:
        """Train until the epochs are done, patience runs out, or ``max_steps`` is reached.

        A trainer that loaded a checkpoint continues from its last finished step.
        The pipeline ends with the values of the last kept update.

        Returns:
            The run's history: every step's scores, and how the run ended
                (``history.stopped``).

        Raises:
            TrainerError: An alias the pipeline, the loss or an optimizer calls is
                not configured (checked before any call is paid for), the loss
                returned something other than a `Feedback` or a score that is not
                finite, or the checkpoint cannot be written.
            TrainingCallFailed: A call of the pipeline, the loss or an optimizer
                failed (an endpoint down, a refused key); re-run to resume.
        """
        from plait.execution.settings import ExecutionSettings
        from plait.resources.manager import ResourceManager

        # One manager for the whole run: every call shares its endpoints (and the
        # embedded model is loaded once).
        manager = ResourceManager.coerce(self.resources)
        self._check_aliases(manager)
        # What the backend starts for this run's passes (Ray workers, a local Ray) is
        # stopped when it ends; what was running already is left as it was.
        session = self._backend().session()
        try:
            with session:
                async with ExecutionSettings(resources=manager):
                    self._manager = manager
                    with self._call_log():
                        return await self._fit()
        finally:
            self._manager = None

    def _check_aliases(self, manager: Any) -> None:
        """Refuse, before any call is paid for, an alias the run will call that the
        resources do not configure: the pipeline's, the loss's (a judge), each
        optimizer's (its rewriter, bootstrap's teacher).  Found mid-run, it would stop
        the run after the minibatch and validation calls were paid for."""
        from plait.demos import required_aliases
        from plait.module import llm_aliases as aliases
        from plait.resources.manager import ResourceManager

        needed: list[tuple[str, set[str], Any]] = [
            ("the pipeline", required_aliases(self.model), manager),
            (f"the loss {type(self.loss_fn).__name__}", aliases(self.loss_fn), manager),
        ]
        for optimizer in self.optimizers:
            own: set[str] = set()
            for module in getattr(optimizer, "_modules", list)():
                own |= aliases(module)
            teacher = getattr(optimizer, "teacher_alias", None)
            if isinstance(teacher, str):
                own.add(teacher)
            teacher_module = getattr(optimizer, "teacher", None)
            if isinstance(teacher_module, Module):
                own |= aliases(teacher_module)
            bound = getattr(optimizer, "resources", None)
            where = manager if bound is None else ResourceManager.coerce(bound)
            needed.append((f"the optimizer {type(optimizer).__name__}", own, where))
        for who, wanted, resources in needed:
            config = resources.config
            if not config:
                continue  # the embedded model answers every alias
            missing = sorted(alias for alias in wanted if alias not in config)
            if missing:
                raise TrainerError(
                    f"{who} calls the alias(es) {', '.join(map(repr, missing))}, which the "
                    f"resources do not configure (they configure: {', '.join(sorted(config))}); "
                    "add it to the resources file, or name a configured alias (plait train: "
                    "--optimizer-alias, --judge-alias, --teacher-alias, --embed)"
                )

    @contextlib.contextmanager
    def _call_log(self) -> Iterator[None]:
        """Log every call completed at the current position, and answer from the log.

        A step is saved only when it ends, so a run killed mid-step redoes the whole
        step; with the log (`plait.execution.checkpoint`, the one ``plait run`` uses),
        every call the killed run completed is answered from ``calls-<step>/`` and
        paid for once.  Calls are keyed on their graph node, their request and how
        many identical calls came before (`_PositionLog`), so a call whose request
        differs (new prompt values) is never answered by another's reply.  The log
        belongs to one position: once the next step's checkpoint is written
        (`_save_checkpoint`), it is replaced by an empty one, so a later step never
        replays an earlier step's replies.  Ray workers log to the same directory
        (`_PositionLog.pass_offset`).
        """
        if self.checkpoint_dir is None:
            yield
            return
        self._calls = _PositionLog(self._open_call_log())
        finished = False
        try:
            with self._calls.outermost():
                yield
            finished = True
        finally:
            log = self._calls.checkpoint
            log.close()
            self._calls = None
            if finished:  # the run ended: nothing is left to resume from it
                shutil.rmtree(log.directory, ignore_errors=True)

    def _open_call_log(self) -> Any:
        """The call log of the current position, opened; the logs of others deleted."""
        from plait.execution.checkpoint import Checkpoint, CheckpointError

        assert self.checkpoint_dir is not None
        directory = self.checkpoint_dir / f"{CALLS_PREFIX}{self.global_step}"
        for old in self.checkpoint_dir.glob(f"{CALLS_PREFIX}*"):
            if old != directory and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        step = type(self.step_module)
        try:
            return Checkpoint(directory, f"{step.__module__}.{step.__qualname__}").open()
        except CheckpointError as exc:  # another run holds it, or it is damaged
            raise TrainerError(str(exc)) from None

    def _advance_call_log(self) -> None:
        """After a checkpoint at a new position: a fresh log for it (see `_call_log`)."""
        handler = self._calls
        if handler is None or handler.checkpoint.directory.name == (
            f"{CALLS_PREFIX}{self.global_step}"
        ):
            return
        handler.checkpoint.close()
        handler.checkpoint = self._open_call_log()
        handler.seen.clear()
        handler.passes.clear()

    @property
    def on_workers(self) -> bool:
        """Whether minibatches and validation run on Ray workers (``workers``, ``ray_address``)."""
        return self.workers is not None or self.ray_address is not None

    async def _fit(self) -> TrainingHistory:
        if self.resumed:
            self._emit("resumed")
            if self.history.stopped == "early_stopping":
                return self.history  # the run had finished; resuming changes nothing
        if self.val_data is not None and self.history.initial_val_score is None:
            score = await self.evaluate()
            self.history.initial_val_score = self.history.best_val_score = score
            self._emit("validated")
            self._save_checkpoint()
        if self.test_data is not None and self.history.initial_test_score is None:
            # Held-out data, scored before any update and after the last: what training
            # really did, on examples it never chose anything by.
            self.history.initial_test_score = await self.evaluate(self.test_data)
            self._save_checkpoint()
        self.history.stopped = ""
        while self.epoch < self.epochs:
            batches = self.batches(self.epoch)
            if self.max_steps is not None and self.global_step >= self.max_steps:
                return await self._finish("max_steps")
            record = await self._train_step(batches[self.batch_index])
            # The position saved is the next batch to train on, so a resume never
            # repeats a step whose update was already kept or rolled back.
            self.batch_index += 1
            if self.batch_index >= len(batches):
                self.epoch, self.batch_index = self.epoch + 1, 0
            self._save_checkpoint()
            self._emit("step", record)
            if self.patience is not None and self.stale_steps >= self.patience:
                return await self._finish("early_stopping")
        return await self._finish("completed")

    async def evaluate(self, data: Iterable[Any] | None = None) -> float:
        """Score the pipeline as it is now: the mean loss score over some examples, in eval mode.

        The calls go to the trainer's ``resources``, inside `fit` or outside it.

        Args:
            data: ``(input, target)`` pairs, mappings or a data file (default: the
                validation set).

        Returns:
            The mean score, 0 to 1.

        Raises:
            TrainerError: There is nothing to evaluate, or the loss failed or
                returned no `Feedback`.
        """
        examples = self.val_data if data is None else load_examples(data)
        if not examples:
            raise TrainerError("nothing to evaluate: no validation set was given")
        scores = await self._scored(examples)
        return sum(scores) / len(scores)

    async def score_examples(self, positions: Sequence[int]) -> list[float]:
        """Score some validation examples with the values of the moment, as a search does.

        Args:
            positions: Indexes into the validation set.

        Returns:
            Each example's loss score, in the order of ``positions``.

        Raises:
            TrainerError: There is no validation set.
        """
        if not self.val_data:
            raise TrainerError("nothing to score: no validation set was given")
        return await self._scored([self.val_data[i] for i in positions]) if positions else []

    async def run_examples(
        self, examples: Sequence[Any], *, feedback: bool = False
    ) -> list[ExampleRun]:
        """Run some examples with the values of the moment and say how each went.

        The examples run as a minibatch does (train mode, through the trainer's
        backend and call log), so a search can judge a candidate on any examples,
        read the loss's words and each stage's call, and a resumed step pays for
        none of the runs it had completed.

        Args:
            examples: ``(input, target)`` pairs or mappings (`load_examples`).
            feedback: Also run the backward pass and return what it gave each
                parameter.

        Returns:
            Each example's `ExampleRun`, in order.

        Raises:
            TrainerError: The loss failed or returned no `Feedback`.
            TrainingCallFailed: A call failed (an endpoint down, a refused key).
        """
        chosen = load_examples(examples)
        if not chosen:
            return []
        if self._manager is None:
            from plait.execution.settings import ExecutionSettings
            from plait.resources.manager import ResourceManager

            async with ExecutionSettings(resources=ResourceManager.coerce(self.resources)):
                return await self._run_examples(chosen, feedback)
        return await self._run_examples(chosen, feedback)

    async def _run_examples(self, examples: list[Example], feedback: bool) -> list[ExampleRun]:
        rows, scores, _ = await self._traced(examples, feedback=feedback)
        runs: list[ExampleRun] = []
        for row, example, score in zip(rows, examples, scores, strict=True):
            payload = row.payload
            result = payload.get("output")
            given: dict[str, list[str]] = {}
            for name, text, _rank in payload.get("feedback") or ():
                given.setdefault(name, []).append(text)
            trace = (
                trace_from_rows(payload["trace"], self.model, example, score)
                if payload.get("trace") is not None
                else None
            )
            text = result.text if isinstance(result, Feedback) else ""
            runs.append(ExampleRun(example, score, text, trace, given))
        return runs

    async def _scored(self, examples: list[Example]) -> list[float]:
        """Each example's loss score, in eval mode, the calls going to the trainer's
        ``resources`` inside `fit` or outside it."""
        if self._manager is None:
            from plait.execution.settings import ExecutionSettings
            from plait.resources.manager import ResourceManager

            async with ExecutionSettings(resources=ResourceManager.coerce(self.resources)):
                return await self._scored_here(examples)
        return await self._scored_here(examples)

    async def _scored_here(self, examples: list[Example]) -> list[float]:
        self.step_module.eval()
        results = await self._pass(examples, train=False)
        return [
            _score(result, self.step_module, example)
            for result, example in zip(results, examples, strict=True)
        ]

    def _backend(self) -> TrainingBackend:
        """Where the passes run: this process, or Ray workers with ``workers`` or
        ``ray_address`` (`backend_name`, the rule a batch run follows)."""
        from plait.execution.runtime import backend_name

        name = backend_name({"workers": self.workers, "ray_address": self.ray_address})
        found = backend(name)
        if not isinstance(found, TrainingBackend):
            raise TrainerError(
                f"the backend {name!r} ({type(found).__name__}) cannot run training passes: "
                "it has no run_steps"
            )
        return found

    def _pass_options(self) -> dict[str, Any]:
        """The options of a pass, resolved as a call in this process resolves them (the
        step's binding, else the `ExecutionSettings` around it)."""
        from plait.execution.settings import resolve_options

        bound_resources, bound_config = self.step_module._binding()
        opts = resolve_options({}, bound_config, bound_resources)
        opts["workers"], opts["ray_address"] = self.workers, self.ray_address
        return opts

    async def _pass(
        self, examples: list[Example], train: bool, feedback: bool = True
    ) -> list[Value]:
        """One result per example, in order, from the step as it is now (its parameter
        values, its mode), run by the trainer's backend; the calls it makes go to the
        position's call log (see `_PositionLog.pass_offset`)."""
        return await self._backend().run_steps(
            self.step_module,
            examples,
            self._pass_options(),
            train=train,
            call_log=self._calls,
            feedback=feedback,
        )

    async def _minibatch(self, batch: list[Example]) -> tuple[float, list[Trace] | None]:
        """The minibatch's mean score and its runs' traces; its feedback put into the
        parameters, in batch order.

        Each example's loss runs in ``train()`` mode and its backward pass is
        collected on its own; the feedback then goes to the parameters example by
        example, so their buffers, and the rewrite prompts made from them, do not
        depend on which example's backward finished first.  When no optimizer needs
        feedback (`BootstrapFewShot` learns from traces) there is no backward pass.
        Each row comes back as its loss's output, the feedback its backward pass gave
        each parameter (named by the step's ``state_dict()`` names, with the rank
        `upstream_rank` uses) and its run as the backend saw it, wherever it ran
        (`plait.learning.passes`).
        """
        needs_feedback = any(getattr(o, "needs_feedback", True) for o in self.optimizers)
        rows, scores, traces = await self._traced(batch, feedback=needs_feedback)
        train_score = sum(scores) / len(scores)
        if needs_feedback:
            params = dict(self.step_module.named_parameters())
            for row in rows:
                receive(
                    Received(params[name], text, rank)
                    for name, text, rank in row.payload["feedback"]
                )
        return train_score, traces

    async def _traced(
        self, batch: list[Example], feedback: bool
    ) -> tuple[list[Value], list[float], list[Trace] | None]:
        """``batch`` run in ``train()`` mode: each example's row, its score, and the
        runs as the backend logged them (None unless every example's came back)."""
        self.step_module.train()
        try:
            rows = await self._pass(batch, train=True, feedback=feedback)
        finally:
            self.step_module.eval()
        outputs = [
            row if row.is_error else Value(kind_of(row.payload["output"]), row.payload["output"])
            for row in rows
        ]
        scores = [
            _score(output, self.step_module, example)
            for output, example in zip(outputs, batch, strict=True)
        ]
        # The runs as the backend logged them: an optimizer learning from runs
        # (`BootstrapFewShot`) is shown these instead of running the examples again.
        traces: list[Trace] | None = [
            trace_from_rows(row.payload["trace"], self.model, example, score)
            for row, example, score in zip(rows, batch, scores, strict=True)
            if row.payload.get("trace") is not None
        ]
        if traces is not None and len(traces) != len(batch):
            traces = None
        return rows, scores, traces

    async def _train_step(self, batch: list[Example]) -> StepRecord:
        spent = _spend()
        for optimizer in self.optimizers:
            optimizer.zero_feedback()
        train_score, traces = await self._minibatch(batch)
        view = TrainingBatch(
            examples=list(batch),
            traces=traces,
            loss_fn=self.loss_fn,
            evaluate=self.evaluate if self.val_data is not None else None,
            score_examples=self.score_examples if self.val_data is not None else None,
            val_size=len(self.val_data or ()),
            run_examples=self.run_examples,
            train_examples=list(self.train_data),
            val_examples=list(self.val_data or ()),
        )
        trials = [await self._trial(optimizer, view) for optimizer in self.optimizers]
        improved = any(trial.kept and trial.val_score is not None for trial in trials)
        self.stale_steps = 0 if improved else self.stale_steps + 1
        self.global_step += 1
        calls, tokens = (now - then for now, then in zip(_spend(), spent, strict=True))
        scored = [trial.val_score for trial in trials if trial.val_score is not None]
        record = StepRecord(
            step=self.global_step,
            epoch=self.epoch,
            batch=self.batch_index,
            train_score=train_score,
            train_loss=1.0 - train_score,
            val_score=scored[-1] if scored else None,
            kept=any(trial.kept for trial in trials),
            improved=improved,
            changed=list(dict.fromkeys(name for trial in trials for name in trial.tried)),
            rejected={k: v for trial in trials for k, v in trial.rejected.items()},
            trials=[trial.to_json() for trial in trials],
            calls=calls,
            tokens=tokens,
        )
        self.history.steps.append(record)
        return record

    async def _trial(self, optimizer: Any, batch: TrainingBatch) -> Trial:
        """One optimizer's update: shown the batch, stepped, then kept only if validation
        scores it better than the best so far (by ``min_delta``), else rolled back."""
        # An Rng's seed and counter are not the optimizer's to change, and running the
        # pipeline (validation, a bootstrap pass) advances the counter: leave them out
        # of what counts as tried and of what a roll-back restores.
        drawn = rng_parameter_names(self.model)
        before = {
            name: value
            for name, value in copy.deepcopy(self.model.state_dict()).items()
            if name not in drawn
        }
        refused = getattr(optimizer, "rejected", None)
        seen = len(refused) if isinstance(refused, list) else 0
        if hasattr(optimizer, "judgement"):
            optimizer.judgement = None  # a verdict is about this step's update only
        try:
            observe = getattr(optimizer, "observe", None)
            if observe is not None:
                await observe(batch)
            await optimizer.step()
        except BaseException as exc:
            # A step that failed part-way may have rewritten some parameters: put every
            # value back so the checkpoint and the model agree on the last good state.
            self.model.load_state_dict(before)
            failed = optimizer_call_failure(optimizer, exc)
            if failed is not None:
                raise failed from None
            raise
        finally:
            optimizer.zero_feedback()
        after = self.model.state_dict()
        tried = {
            name: value
            for name, value in after.items()
            if name not in drawn and before.get(name) != value
        }
        rejected = (
            {r.name: r.reason for r in refused[seen:] if hasattr(r, "reason")}
            if isinstance(refused, list)
            else {}
        )
        trial = Trial(
            optimizer=type(optimizer).__name__,
            tried=copy.deepcopy(tried),
            val_score=None,
            kept=True,
            rejected=rejected,
            candidates=list(getattr(optimizer, "candidate_scores", None) or []),
            search=dict(getattr(optimizer, "search_report", None) or {}),
        )
        if self.val_data is None:
            return trial
        if not tried:
            # Nothing changed: the values are the proven ones, with the score they have.
            trial.kept, trial.val_score = False, self.history.best_val_score
            return trial
        judgement = _judgement_of(optimizer)
        if judgement is not None and judgement.val_score is not None:
            trial.val_score = judgement.val_score  # measured already on all of validation
        else:
            trial.val_score = await self.evaluate()
        best = self.history.best_val_score
        if judgement is not None and judgement.keep is not None:
            # The optimizer decided on more evidence than validation alone holds.
            trial.kept, trial.decided_by = judgement.keep, judgement.evidence
        else:
            # The gate: only an update validation scores better (by min_delta, or at
            # all) is kept; a tie keeps the values already proven, so training can
            # never leave the pipeline worse on validation than it started.
            trial.kept = best is None or self._better(trial.val_score, best)
        if trial.kept:
            self.history.best_val_score = trial.val_score
        else:
            self.model.load_state_dict(before)
        return trial

    async def _finish(self, reason: str) -> TrainingHistory:
        if self.refit and not self.history.refit:
            await self._refit()
            self._save_checkpoint()
        if self.test_data is not None:
            self.history.final_test_score = await self.evaluate(self.test_data)
        return self._stop(reason)

    async def _refit(self) -> None:
        """Run every labelled example (training and validation) as one batch and let
        each optimizer that can grow its pools by their pairs (`BootstrapFewShot.refit`):
        validation has chosen how demonstrations are picked (the method, ``k``); the
        final pipeline then picks them among every labelled example, not only those of
        the steps the gate kept (a later step's bigger pool that only tied was rolled
        back).  No score judges this (each validation input would find itself in the
        pool), so it is opt-in, recorded in ``history.refit``, and the held-out test
        split is what measures it."""
        assert self.val_data is not None  # checked when refit=True was given
        before = self.model.state_dict()
        examples = [*self.train_data, *self.val_data]
        _, _, traces = await self._traced(examples, feedback=False)
        view = TrainingBatch(
            examples=examples,
            traces=traces,
            loss_fn=self.loss_fn,
            val_size=len(self.val_data),
        )
        grown: dict[str, Any] = {}
        for optimizer in self.optimizers:
            refit = getattr(optimizer, "refit", None)
            if refit is not None:
                grown.update(await refit(view))
        self.history.refit = {
            "examples": len(examples),
            "pools": {
                name: [len(before[name]["pool"]), len(value["pool"])]
                for name, value in grown.items()
            },
        }

    def _better(self, score: float, best: float) -> bool:
        if self.min_delta > 0:
            return score >= best + self.min_delta
        return score > best

    def _stop(self, reason: str) -> TrainingHistory:
        self.history.stopped = reason
        self._save_checkpoint()
        self._emit("stopped")
        return self.history

    def _emit(self, kind: str, record: StepRecord | None = None) -> None:
        if self.on_event is not None:
            self.on_event(
                TrainingEvent(kind, self.global_step, self.total_steps, self.history, record)
            )

    # -- checkpoints ---------------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        """What must match for a checkpoint to be this run's (`run_identity`)."""
        return run_identity(
            self.model,
            self.loss_fn,
            self.resources,
            train=self.train_data,
            val=self.val_data,
            test=self.test_data,
            batch_size=self.batch_size,
            seed=self.seed,
            shuffle=self.shuffle,
        )

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs: what the checkpoint holds.

        Returns:
            JSON-ready data: what makes the run the same run, the position, the
                parameters, each optimizer's state and the history.
        """
        states = [o.state_dict() if hasattr(o, "state_dict") else None for o in self.optimizers]
        return {
            "format": CHECKPOINT_FORMAT,
            **self._identity(),
            "epoch": self.epoch,
            "batch": self.batch_index,
            "global_step": self.global_step,
            "stale_steps": self.stale_steps,
            "parameters": self.model.state_dict(),
            "optimizer": states[0],
            "optimizers": states,
            "history": self.history.to_json(),
        }

    def _save_checkpoint(self) -> None:
        if self.checkpoint_dir is None:
            return
        state = self.state_dict()
        try:
            text = json.dumps(state, indent=1, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TrainerError(
                f"the training state cannot be saved as JSON ({exc}); checkpointing needs "
                "parameter values and optimizer state made of strings, numbers, lists and dicts"
            ) from None
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.checkpoint_dir / CHECKPOINT_FILE, text)
        self.history.save(self.checkpoint_dir / HISTORY_FILE)
        self._advance_call_log()

    def _load_checkpoint(self) -> bool:
        """Continue a run from ``checkpoint_dir`` if it holds one; True if it did."""
        if self.checkpoint_dir is None:
            return False
        path = self.checkpoint_dir / CHECKPOINT_FILE
        if not path.exists():
            return False
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TrainerError(f"cannot read the checkpoint {path}: {exc}") from None
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise TrainerError(
                f"{path} is not a plait trainer checkpoint ({CHECKPOINT_FORMAT}); choose "
                "another checkpoint directory or delete it"
            )
        states = check_resume(self.checkpoint_dir, state, self._identity(), self.optimizers)
        self.model.load_state_dict(state["parameters"])
        for optimizer, saved in zip(self.optimizers, states, strict=True):
            if saved is not None and hasattr(optimizer, "load_state_dict"):
                optimizer.load_state_dict(saved)
        self.history = TrainingHistory.from_json(state["history"])
        self.epoch = int(state["epoch"])
        self.batch_index = int(state["batch"])
        self.global_step = int(state["global_step"])
        self.stale_steps = int(state["stale_steps"])
        return True


def _score(result: Any, step: Module | None = None, example: Example | None = None) -> float:
    """The score of one loss result: a Feedback, or a Value (train mode) carrying one.

    A score that is not a finite number (a hand-written loss dividing by zero) is an
    error naming the loss and the example: averaged in, it would make every later
    comparison false and the history unreadable as JSON.
    """
    payload = result.payload if isinstance(result, Value) else result
    if isinstance(result, Value) and result.is_error:
        raise training_call_failure(result, step)
    if isinstance(payload, Feedback):
        score = payload.score
    elif isinstance(payload, int | float) and not isinstance(payload, bool):
        score = float(payload)
    else:
        raise TrainerError(
            f"the loss returned a {type(payload).__name__}, not a Feedback: a Trainer needs a "
            "loss module whose output is plait.learning.Feedback (see plait.learning.losses)"
        )
    if not math.isfinite(score):
        loss_fn = getattr(step, "loss_fn", None)
        loss = type(loss_fn).__name__ if loss_fn is not None else "the loss"
        shown = repr(example[0]) if example is not None else "an example"
        if len(shown) > 80:
            shown = shown[:77] + "..."
        raise TrainerError(
            f"the loss {loss} scored {score!r} for the example {shown}: a score must be a "
            "finite number (0 to 1, higher is better); fix the loss so it never divides by "
            "zero or returns NaN/inf"
        )
    return score


#: A worker pass keys its calls from a multiple of this drawn from what it runs: apart
#: from other passes and from this process's calls (keyed from 0 by occurrence).
_PASS_STRIDE = 1_000_000_000


class _PositionLog(CheckpointHandler):
    """The trainer's call log (`Trainer._call_log`): a call is keyed on its graph node,
    its request and how many identical calls came before it at this position.

    Every run of a training position is a single input (index 0), so the count, not
    the index, tells a validation call from the same request in the minibatch: each
    is paid once, as in a run never interrupted, and a resumed run is answered in the
    same order the killed one logged them.
    """

    def __init__(self, checkpoint: Any) -> None:
        super().__init__(checkpoint)
        self.seen: dict[tuple[str, str], int] = {}
        #: Passes sent to other processes at this position, by what they ran (`pass_offset`).
        self.passes: dict[str, int] = {}

    def key(self, msg: Message, request: LLMRequest) -> tuple[int, str, str]:
        assert msg.node_id is not None
        call = (msg.node_id, request.fingerprint())
        occurrence = self.seen.get(call, 0)
        self.seen[call] = occurrence + 1
        return (occurrence, *call)

    def pass_offset(self, work: Any, values: dict[str, Any], seed: int | None) -> int:
        """Where a pass run in other processes (Ray workers) logs its calls in this log.

        Each such pass numbers its examples from 0, so its calls go under indexes of
        its own, drawn from what it runs (``work``: the method and the examples; the
        parameter ``values`` and the ``seed`` it runs with) and how many such passes
        came before at this position: the same pass of a resumed step finds its calls
        again, and a repeated pass (validation of values already scored) pays for its
        calls as it does in one process.  The values are part of it because a resumed
        step skips the passes the checkpoint already holds (the initial validation,
        made at the same position): counted by method and examples alone, each of the
        step's validation passes would come one place earlier and miss its calls.
        """
        what = digest([work, values, seed])
        repeat = self.passes.get(what, 0)
        self.passes[what] = repeat + 1
        return (1 + int(digest([what, repeat], size=4), 16)) * _PASS_STRIDE


def _check_refit(model: Module, optimizers: list[Any], val: list[Example] | None) -> None:
    """``refit=True`` needs validation examples, a pool to grow and an optimizer that
    grows it; say which is missing and how to get it."""
    if val is None:
        raise TrainerError(
            "refit=True adds every labelled example to the demonstration pools once "
            "validation has chosen how they are picked: give val_data"
        )
    if not any(is_pool(p.value) for p in model.parameters()):
        raise TrainerError(
            "refit=True grows demonstration pools chosen per input, and this pipeline has "
            "none: give its LLMInference calls demos=plait.knn_demos(k=4)"
        )
    if not any(hasattr(o, "refit") for o in optimizers):
        names = ", ".join(type(o).__name__ for o in optimizers)
        raise TrainerError(
            f"refit=True needs an optimizer that gathers demonstrations (BootstrapFewShot "
            f"or DemoSearch); this run has {names}"
        )


def _judgement_of(optimizer: Any) -> Judgement | None:
    """The optimizer's verdict on the update it just made (`Judgement`), if it gave one."""
    found = getattr(optimizer, "judgement", None)
    if found is None:
        return None
    if not isinstance(found, Judgement):
        raise TypeError(
            f"{type(optimizer).__name__}.judgement must be a plait.learning.Judgement or None, "
            f"got {type(found).__name__}"
        )
    if found.val_score is not None and not (
        isinstance(found.val_score, int | float) and math.isfinite(found.val_score)
    ):
        raise TrainerError(
            f"{type(optimizer).__name__} judged its update with a validation score that is "
            f"not a finite number ({found.val_score!r})"
        )
    return found


def _optimizer_list(optimizer: Any) -> list[Any]:
    """The optimizers a Trainer was given: one, or a list applied in order each step."""
    found = list(optimizer) if isinstance(optimizer, list | tuple) else [optimizer]
    if not found:
        raise TrainerError("no optimizer: give one, or a list such as [bootstrap, sfa]")
    for item in found:
        missing = [name for name in ("step", "zero_feedback") if not hasattr(item, name)]
        if missing:
            raise TypeError(
                f"a Trainer optimizer needs step() and zero_feedback(); a "
                f"{type(item).__name__} has no {' or '.join(missing)}"
            )
    return found


def _spend() -> tuple[int, int]:
    """Requests sent and tokens used so far in this process (its Ray workers included)."""
    from plait.resources.usage import usage

    rows = usage().as_dict().values()
    return (
        sum(int(row["requests"]) for row in rows),
        sum(int(row["prompt_tokens"]) + int(row["completion_tokens"]) for row in rows),
    )
