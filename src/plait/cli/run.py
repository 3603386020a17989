"""``plait run``: a pipeline over a file of inputs, resumable, with progress and a bill.

The rows run on a backend picked by name (`plait.execution.backends`): ``"local"``,
this process's event loop with the same window of inputs, checkpoints and handlers
as ``module.stream()``, or ``"ray"`` for ``--workers``/``--ray-address``.  Either
hands each row over as it arrives (``deliver_rows``); the CLI adds what a batch job
at a terminal needs: inputs read lazily from a file, one JSON line out per input as it
completes, a progress display, a usage table, and a clean stop on Ctrl-C that
the same command resumes.

Resume: the checkpoint lives next to the output (``out.jsonl.checkpoint/``)
unless ``--checkpoint`` says otherwise.  Re-running the command answers every
finished input from the checkpoint (no request, no cost) and runs only the rest;
the output file is rewritten in full, so it holds each input exactly once.
Output to stdout has no default checkpoint: pass ``--checkpoint DIR`` to make such
a run resumable.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from plait._locks import Busy, hold
from plait._secrets import scrub
from plait.cli.options import (
    UsageError,
    add_otel_argument,
    add_parameters_argument,
    add_profile_argument,
    add_resources_argument,
    add_run_settings_arguments,
    otel_handler,
    parse_target_args,
    positive_int,
    report_error,
    resolve_resources,
    target_parser,
)
from plait.cli.outputs import OutputWriter, error_record, silence_stdout
from plait.cli.parameters import ParametersError, load_parameters
from plait.cli.progress import Tally, call_sites, console, duration, make_display, show
from plait.execution.backends import RowBackend, backend
from plait.execution.checkpoint import FORMAT as CHECKPOINT_FORMAT
from plait.execution.checkpoint import Checkpoint, CheckpointError
from plait.execution.runtime import Prepared, backend_name
from plait.execution.settings import resolve_options
from plait.inputs import FORMATS, InputError, InputSource, Item, count_inputs, open_inputs
from plait.module import Module
from plait.ray.cluster import ClusterUnreachable, cluster_address, ensure_ray
from plait.resources.config import ConfigurationError
from plait.resources.manager import ResourceManager
from plait.resources.usage import reset_usage, usage
from plait.sampling import SeedError, run_seed
from plait.target import Target, TargetError, code_files
from plait.tracing.tracer import TracingError
from plait.values import Value, error_value

__all__ = ["build_parser", "check_writable", "main", "refuse_to_clobber"]

#: Failed inputs quoted in the end-of-run summary.
FAILURES_SHOWN = 3

DESCRIPTION = """\
Run TARGET over every input and write one JSON line per input as it completes:
  {"index": i, "input": ..., "output": ...}
  {"index": i, "input": ..., "error": {"type": ..., "message": ..., "module_path": ...}}

TARGET is file.py:Name or package.module:Name: a Module class, or a function
that returns a Module.  key=value arguments configure it (blueprint arguments:
`plait run TARGET --help` lists them with their types, values and layers).

Inputs (--input FILE, or - for stdin; the format comes from the file's suffix,
.jsonl/.json/.ndjson, .csv/.tsv, .txt, or is sniffed; --format overrides):
  JSONL     one JSON value per line
  CSV       a header row, then one input per row (an object of column -> text)
  text      one input per non-empty line
  document  the whole file (or stdin) is one input
--input DIR: each regular file in the directory (sorted by name; hidden files,
named .*, skipped) is one input, its whole text (the output's "input" is the
file's path).
An object (JSON object or CSV row) with --field NAME passes that field.  Without
--field, an object whose fields include every required parameter of forward()
passes those fields by name (the others are not passed: stderr names them once);
one that does not is passed whole only to a forward() whose one parameter is
annotated dict/Mapping or named record, row, example, item or data, and is
refused otherwise (before the run, when it is the first record).  Every other
value is the one argument.  A CSV file whose quoting is broken is refused,
naming the line where the unclosed quoted field starts.

--parameters FILE loads the values `plait train` learned (its parameters.json)
before the run; names the file does not set keep their defaults.  With another
file, a rerun over the same checkpoint runs every input again, paying only for
the calls whose requests changed.

Resume: the checkpoint defaults to OUTPUT.checkpoint/ beside the output file.
Stop with Ctrl-C at any time, then re-run the same command: finished inputs are
answered from the checkpoint (not re-run, not re-paid) and the output file is
rewritten with every input exactly once.  After an edit of the pipeline's file
(its prompts in __init__ included, or a file of yours it imports), other
key=value arguments or another --parameters file, the same command runs every
input again on the new version, paying only for the calls whose requests
changed.  Another model or endpoint behind an alias, or another --seed, is
refused.  Output to stdout is resumable only with --checkpoint DIR.  --fresh
deletes the checkpoint and starts over (and pays for every call again).

Exit status: 0 every input succeeded, 1 some failed, 2 usage or configuration
error, 130 interrupted.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = target_parser("run", "plait run TARGET [key=value ...] [options]", DESCRIPTION)
    parser.add_argument(
        "-i", "--input", default="-", metavar="FILE", help="inputs: a file, a directory, - (stdin)"
    )
    parser.add_argument(
        "-o", "--output", default="-", metavar="FILE", help="JSONL outputs (default: - , stdout)"
    )
    parser.add_argument(
        "--format",
        "--input-format",
        dest="format",
        choices=FORMATS,
        default="auto",
        help="input format (default: by suffix; document: the whole file is one input)",
    )
    parser.add_argument("--field", metavar="NAME", help="pass this field of each input object")
    add_resources_argument(parser)
    add_parameters_argument(parser)
    add_run_settings_arguments(parser)
    parser.add_argument(
        "--checkpoint", metavar="DIR", help="checkpoint directory (default: OUTPUT.checkpoint)"
    )
    parser.add_argument("--no-checkpoint", action="store_true", help="do not checkpoint")
    parser.add_argument("--fresh", action="store_true", help="delete the checkpoint; start over")
    add_profile_argument(parser)
    add_otel_argument(parser)
    parser.add_argument(
        "--preserve-order", action="store_true", help="write outputs in input order"
    )
    parser.add_argument("--limit", type=positive_int, metavar="N", help="only the first N inputs")
    parser.add_argument(
        "--workers",
        type=positive_int,
        metavar="N",
        help="run on N Ray worker processes, endpoint limits shared (needs plait[ray])",
    )
    parser.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="join this Ray cluster ('auto': the local one) instead of starting Ray",
    )
    parser.add_argument(
        "--batch-api",
        action="store_true",
        help="send every LLM call through its provider's batch API (half the price; each "
        "stage waits for its batch, minutes to hours); resumable like any run",
    )
    parser.add_argument(
        "--show", action="store_true", help="print a table of the results when done"
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress display, no usage table: the summary line and errors only",
    )
    parser.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    return parser


def _error(message: str) -> int:
    return report_error("run", message)


def main(argv: list[str]) -> int:
    ns = parse_target_args(build_parser(), argv)
    if isinstance(ns, int):
        return ns
    try:
        return _Command(ns, argv).run()
    except (
        UsageError,
        TargetError,
        InputError,
        ConfigurationError,
        ParametersError,
        ClusterUnreachable,
    ) as exc:
        return _error(str(exc))


# -- the command -------------------------------------------------------------------------------
class _Command:
    def __init__(self, ns: argparse.Namespace, argv: list[str] | None = None) -> None:
        self.ns = ns
        #: The command line after ``plait run``, to tell the user how to run it again.
        self.argv = list(argv or [])
        self.err: IO[str] = sys.stderr
        self.seed: int | None = None
        self.items: Iterator[Item] = iter(())
        #: The OpenTelemetry handler of ``--otel`` (made before anything runs: a missing
        #: extra is said at once), else a block that does nothing.
        self.telemetry: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()

    def say(self, message: str) -> None:
        print(f"plait run: {message}", file=self.err, flush=True)

    def run(self) -> int:
        ns = self.ns
        if ns.no_checkpoint and ns.checkpoint:
            raise UsageError("--checkpoint and --no-checkpoint contradict each other; drop one")
        if ns.input == "-" and _interactive(sys.stdin):
            raise UsageError("no inputs: give --input FILE, or pipe them to stdin (--input -)")
        _refuse_to_clobber(ns)
        self.telemetry = otel_handler(ns)
        if ns.ray_address is not None or (ns.workers and cluster_address(None)):
            # Joined now, before any file is opened or input read: a port that answers
            # may still be no Ray head, which only joining tells.
            ensure_ray(ns.ray_address)
        module = Target(ns.target, ns.assignments).make()
        if ns.batch_api and ns.resources is None and not module._bound_resources:
            from plait.providers.base import BATCH_APIS

            raise UsageError(
                "--batch-api sends every call to its provider's batch API, and without "
                "resources every alias runs on the embedded local model, which has none: "
                "pass --resources FILE naming endpoints whose provider has a batch API "
                f"({', '.join(BATCH_APIS)})"
            )
        if ns.parameters is not None:
            # Before the checkpoint is opened: its producer hashes the loaded values.
            load_parameters(module, ns.parameters, "run", self.err)
        source = open_inputs(ns.input, ns.format, ns.field, module.forward, self.say)
        try:
            self.items = _refuse_unfit(source.items(), ns.field)
        except BaseException:
            source.close()
            raise
        # Drawn once (from the pipeline's Rng when no seed is given): the checkpoint's
        # producer and every input of the run use this one.
        try:
            explicit = resolve_options({"seed": ns.seed}, module._bound_config, None)["seed"]
            self.seed, _ = run_seed(module, explicit)
        except SeedError as exc:
            source.close()
            raise UsageError(str(exc)) from None
        try:
            resources = self._resources(module)
            checkpoint = self._checkpoint(module, resources)
            try:
                return self._execute(module, resources, source, checkpoint)
            finally:
                if checkpoint is not None:
                    checkpoint.close()
        finally:
            source.close()

    def _resources(self, module: Module) -> ResourceManager:
        """Resolve every alias before the first input, so a missing one is a usage error."""
        reset_usage()  # the usage table reports this run alone
        manager: ResourceManager = resolve_resources(
            "run", self.ns.target, module, self.ns.resources
        )
        return manager

    def _checkpoint_dir(self) -> Path | None:
        ns = self.ns
        if ns.no_checkpoint:
            return None
        if ns.checkpoint:
            return Path(ns.checkpoint)
        if ns.output == "-":
            return None
        return Path(ns.output + ".checkpoint")

    def _checkpoint(self, module: Module, resources: ResourceManager) -> Checkpoint | None:
        """Open (or start) the checkpoint before the output file is touched.

        A checkpoint that belongs to another pipeline, or whose calls were answered by
        other endpoints, would answer inputs with someone else's outputs: refuse it.
        Another version of this pipeline (an edit, other arguments) reruns its inputs.
        """
        directory = self._checkpoint_dir()
        if directory is None:
            return None
        if self.ns.fresh:
            pending = _remove_checkpoint(directory)  # never one another run is using
            if pending:
                self.say(
                    f"--fresh dropped {len(pending)} batch(es) still pending at the provider, "
                    "which it will bill and whose results no run will collect; cancel them "
                    f"there if you do not want them: {', '.join(pending)}"
                )
        try:
            checkpoint = Checkpoint.of_run(
                directory, module, resources, self.seed, self.ns.assignments, self.ns.target
            ).open()
        except CheckpointError as exc:
            raise UsageError(_with_fresh(exc, "delete it")) from None
        if checkpoint.code_changed:
            self.say(
                f"the pipeline changed since {directory} was written "
                f"({'; '.join(checkpoint.changes)}): its inputs run again, and only calls "
                "whose requests changed are paid for"
            )
        if checkpoint.outputs:
            self.say(
                f"resuming from {directory}: {len(checkpoint.outputs)} finished input(s) will be "
                "answered from the checkpoint"
            )
        return checkpoint

    def _execute(
        self,
        module: Module,
        resources: ResourceManager,
        source: InputSource,
        checkpoint: Checkpoint | None,
    ) -> int:
        ns = self.ns
        tally = Tally()
        tally.calls_per_input = call_sites(module)
        if ns.limit is not None:
            tally.total = ns.limit

        def counted(count: int) -> None:
            tally.total = min(count, ns.limit) if ns.limit is not None else count

        count_inputs(source, counted)
        items: Iterator[Item] = self.items
        if ns.limit is not None:
            items = _first(items, ns.limit)
        options: dict[str, Any] = {"resources": resources, "checkpoint_dir": None}
        if ns.max_concurrent is not None:
            options["max_concurrent"] = ns.max_concurrent
        opts = resolve_options(options, module._bound_config, None)
        opts["seed"] = self.seed
        # The command owns the checkpoint (opened above), the order and where the rows
        # run (Ray for --workers or --ray-address, else this process), whatever bind() said.
        opts["checkpoint_dir"] = None
        opts["preserve_order"] = bool(ns.preserve_order)
        if ns.batch_api and (ns.workers or ns.ray_address is not None):
            raise UsageError(
                "--batch-api sends the calls to the provider's batch API from this process; "
                "--workers/--ray-address would spread them over Ray: drop one of them"
            )
        if ns.batch_api:  # an alias whose provider has no batch API: before the output opens
            from plait.execution.batch_api import check_batch_apis

            check_batch_apis(module, resources)
        named = "batch" if ns.batch_api else None
        opts.update(workers=ns.workers, ray_address=ns.ray_address, backend=named)
        where = _row_backend(backend_name(opts))

        if ns.output != "-" and Path(ns.output).is_dir():
            raise UsageError(f"--output {ns.output} is a directory; give the path of a file")
        try:
            writer = OutputWriter(ns.output)
        except Busy as exc:
            raise UsageError(
                f"the output {ns.output} is being written by {exc.holder}; two runs writing "
                "one file would interleave their rows. Wait for it, or choose another --output"
            ) from None
        except OSError as exc:
            raise UsageError(
                f"cannot write --output {ns.output} ({exc.strerror or exc}); choose a path in "
                "a directory you can write to"
            ) from None
        display = make_display(tally, self.err, quiet=ns.quiet)
        profiler: Any = contextlib.nullcontext()
        if ns.profile:
            from plait.handlers.profiling import profile

            Path(ns.profile).parent.mkdir(parents=True, exist_ok=True)
            profiler = profile()  # written below, unless the run is refused
        started = time.monotonic()
        display.start()
        try:
            with profiler, self.telemetry, where.session():
                where.deliver_rows(
                    module,
                    resources,
                    items,
                    _preparer(tally),
                    _deliverer(writer, tally, display),
                    opts,
                    checkpoint,
                )
        except KeyboardInterrupt:
            display.stop()
            writer.close()
            self._write_trace(profiler)
            return self._interrupted(tally, checkpoint)
        except BrokenPipeError:
            display.stop()
            silence_stdout()
            self._write_trace(profiler)
            self.say("stopped: the reader of the output went away")
            return 1
        # A refused run leaves the output file (and the trace) as they were: the rows a
        # finished run paid for survive a re-run with an edited input.
        except CheckpointError as exc:
            display.stop()
            writer.discard()
            raise UsageError(_with_fresh(exc, "delete the checkpoint")) from None
        except TracingError as exc:  # the first input traced failed: the code is wrong
            display.stop()
            writer.discard()
            raise UsageError(
                f"{ns.target} cannot be traced, so no input was run and nothing was paid for: {exc}"
            ) from None
        except ClusterUnreachable as exc:
            display.stop()
            writer.discard()
            raise UsageError(str(exc)) from None
        except OSError as exc:  # the output or the checkpoint could not be written
            display.stop()
            with contextlib.suppress(OSError):
                writer.close()
            self._write_trace(profiler)
            self.say(f"error: stopped: {exc}")
            return 1
        except BaseException:
            display.stop()
            writer.close()
            self._write_trace(profiler)
            raise
        display.stop()
        writer.close()
        self._write_trace(profiler)
        return self._summary(tally, checkpoint, time.monotonic() - started)

    def _write_trace(self, profiler: Any) -> None:
        if self.ns.profile:
            profiler.write(self.ns.profile)

    # -- reporting -------------------------------------------------------------------------
    def _where(self) -> str:
        return "stdout" if self.ns.output == "-" else self.ns.output

    def _interrupted(self, tally: Tally, checkpoint: Checkpoint | None) -> int:
        total = f" of {tally.total}" if tally.total is not None else ""
        kept = f", {_calls_kept(checkpoint)} call(s) kept" if checkpoint is not None else ""
        self.say(
            f"interrupted: {tally.succeeded}{total} input(s) finished, {tally.failed} failed"
            f"{kept}; outputs so far in {self._where()}"
        )
        if checkpoint is not None:
            # --fresh again would delete what this run paid for.
            same = "the same command without --fresh" if self.ns.fresh else "the same command"
            self.say(
                f"to resume, re-run {same}: finished inputs and calls are answered from "
                f"{checkpoint.directory} and not paid for again"
            )
            self._pending_batches(checkpoint)
        else:
            self.say("this run had no checkpoint, so a re-run starts over (see --checkpoint)")
        return 130

    def _pending_batches(self, checkpoint: Checkpoint) -> None:
        """After Ctrl-C on a batch-API run: the batches it leaves at the provider, which
        go on (and are billed) there, and the command that collects their results."""
        from plait.execution.batch_api import LEDGER_NAME
        from plait.providers.base import ProviderError
        from plait.resources.batching import BatchLedger

        path = checkpoint.directory / LEDGER_NAME
        if not self.ns.batch_api or not path.is_file():
            return
        try:
            unfinished = BatchLedger(path).load().unfinished()
        except (OSError, ProviderError):
            return
        ids = [batch.batch_id for batch in unfinished if batch.batch_id is not None]
        if not ids:
            return
        again = scrub(shlex.join(["plait", "run", *(a for a in self.argv if a != "--fresh")]))
        self.say(
            f"{len(ids)} batch(es) still pending at the provider ({', '.join(ids)}): they "
            "run there, and are billed, whether or not a run waits for them. To collect "
            f"their results (nothing is submitted twice), run: {again}"
        )

    def _where_things_are(self, checkpoint: Checkpoint | None) -> None:
        self.say(f"outputs: {self._where()}")
        if checkpoint is not None:
            self.say(f"checkpoint: {checkpoint.directory} (re-running resumes; --fresh restarts)")
        elif self.ns.output == "-" and not self.ns.no_checkpoint:
            self.say("checkpoint: none (output to stdout: add --checkpoint DIR to resume runs)")
        if self.ns.profile:
            self.say(f"trace: {self.ns.profile} (open it in ui.perfetto.dev)")
        report = usage()
        if report.rows:
            show(self.err, report.table())

    def _summary(self, tally: Tally, checkpoint: Checkpoint | None, elapsed: float) -> int:
        resumed = f", {tally.resumed} from the checkpoint" if tally.resumed else ""
        self.say(
            f"{tally.finished} input(s): {tally.succeeded} succeeded, {tally.failed} failed"
            f"{resumed}, in {duration(elapsed)}"
        )
        if self.ns.show and self.ns.output != "-":
            _print_results(Path(self.ns.output))
        if not self.ns.quiet:  # -q: the summary line and the errors, nothing else
            self._where_things_are(checkpoint)
        if tally.failed:
            shown = "; ".join(
                f"#{index} {error['type']}"
                + (f" in {error['module_path']}" if error.get("module_path") else "")
                + f": {_clip(str(error['message']))}"
                for index, error in tally.failures[:FAILURES_SHOWN]
            )
            more = " ..." if tally.failed > FAILURES_SHOWN else ""
            print(
                f"plait run: {tally.failed} of {tally.finished} input(s) failed: {shown}{more}",
                file=self.err,
                flush=True,
            )
            return 1
        return 0


# -- the rows ------------------------------------------------------------------------------
def _row_backend(name: str) -> RowBackend:
    """The backend the rows run on, by the name it is registered under."""
    found = backend(name)
    if not isinstance(found, RowBackend):
        raise UsageError(
            f"the {name!r} backend ({type(found).__name__}) cannot hand rows over as they "
            "arrive, which plait run needs to write them"
        )
    return found


def _preparer(tally: Tally) -> Callable[[Item], Prepared]:
    """What the backend calls as it admits an input: its arguments (now in flight), or,
    for an input that could not be read, the error that is its row."""

    def prepare(item: Item) -> Prepared:
        if item.problem is not None:
            return error_value(InputError(item.problem), module_path=None)
        tally.in_flight += 1
        return item.args, item.kwargs

    return prepare


def _deliverer(
    writer: OutputWriter, tally: Tally, display: Any
) -> Callable[[int, Item, Value], None]:
    """What happens to each finished input: its row is written, then counted (the
    summary is what was written, never what was expected).  A row that cannot be
    written at all raises, which stops the run."""

    def deliver(index: int, item: Item, value: Value) -> None:
        if item.problem is None:
            tally.in_flight -= 1
        value = writer.write(index, item.raw, value)  # an unwritable output: its error
        if value.is_error:
            tally.failed += 1
            if len(tally.failures) < FAILURES_SHOWN:
                tally.failures.append((index, error_record(value)))
        else:
            tally.succeeded += 1
            if value.meta.get("checkpoint") == "hit":
                tally.resumed += 1
        display.changed()

    return deliver


def _print_results(path: Path) -> None:
    """The outputs file as a table on stdout, for a run someone is watching (the demo)."""
    from rich.table import Table

    table = Table(show_lines=True)
    for column in ("#", "input", "output"):
        table.add_column(column, overflow="fold")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    for row in sorted(rows, key=lambda r: int(r["index"])):
        result = row.get("output", None)
        shown = (
            f"ERROR {row['error'].get('type')}: {row['error'].get('message')}"
            if "error" in row
            else json.dumps(result, ensure_ascii=False, indent=1)
            if not isinstance(result, str)
            else result
        )
        table.add_row(str(row["index"]), _clip(json.dumps(row["input"], ensure_ascii=False)), shown)
    out = console(sys.stdout)
    # The path on a line of its own, never wrapped or cut (a table title is, to its width):
    # it is what a reader copies.
    out.print(f"results ({path})", soft_wrap=True, markup=False, highlight=False)
    out.print(table)


def _refuse_unfit(items: Iterator[Item], field_name: str | None) -> Iterator[Item]:
    """The inputs, once the first is known to fit ``forward``: a first record whose
    fields fit no parameter means every record does not, so the run is refused now,
    before anything is paid for (a later record like it is that input's error)."""
    first = next(items, None)
    if first is None:
        return items
    if first.unfit and first.problem is not None:
        raise UsageError(first.problem)
    return itertools.chain([first], items)


def _first(items: Iterator[Item], limit: int) -> Iterator[Item]:
    for count, item in enumerate(items, start=1):
        yield item
        if count >= limit:
            return


def _remove_checkpoint(directory: Path) -> list[str]:
    """Delete a checkpoint for --fresh, but only one plait wrote (never an arbitrary folder);
    the ids of the provider batches it recorded as still pending (a --batch-api run's)."""
    if not directory.exists():
        return []
    manifest = directory / "manifest.json"
    try:
        ours = json.loads(manifest.read_text())["format"] == CHECKPOINT_FORMAT
    except (OSError, ValueError, KeyError, TypeError):
        ours = False
    if not ours and (not directory.is_dir() or any(directory.iterdir())):
        raise UsageError(
            f"--fresh would delete {directory}, which is not a plait checkpoint; remove it "
            "yourself or choose another --checkpoint"
        )
    if ours:
        try:
            os.close(hold(directory / "lock"))
        except Busy as exc:
            raise UsageError(
                f"--fresh would delete {directory} while {exc.holder} is using it; wait for "
                "that run to finish"
            ) from None
    from plait.execution.batch_api import LEDGER_NAME
    from plait.resources.batching import BatchLedger

    pending: list[str] = []
    if ours and (directory / LEDGER_NAME).is_file():
        ledger = BatchLedger(directory / LEDGER_NAME).load()
        pending = [b.batch_id for b in ledger.unfinished() if b.batch_id is not None]
    shutil.rmtree(directory)
    return pending


def _calls_kept(checkpoint: Checkpoint) -> int:
    """The completed calls a checkpoint holds, those its Ray workers logged included."""
    with contextlib.suppress(CheckpointError, OSError):
        checkpoint.refresh()
    return len(checkpoint.calls)


def _with_fresh(exc: CheckpointError, what: str) -> str:
    """A checkpoint's refusal, with --fresh as the way out when starting over helps and
    the message does not already say so."""
    message = str(exc)
    if not exc.fresh_helps or "--fresh" in message:
        return message
    return f"{message} (or add --fresh to {what} and start over)"


def _clip(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _refuse_to_clobber(ns: argparse.Namespace) -> None:
    """Refuse, before anything is opened for writing, a file the run writes that is its
    input (truncating it would destroy the inputs before they are read), the trace
    and the outputs in one file, and a trace the run could not write at the end."""
    written = [target for target in (ns.output, ns.profile) if target not in (None, "-")]
    if len(written) == 2 and _same_file(Path(ns.output), Path(ns.profile)):
        raise UsageError(
            f"--profile {ns.profile} is the --output file: the trace would replace the "
            "outputs at the end of the run; give --profile another path"
        )
    refuse_to_clobber(
        {
            "--input": ns.input,
            "--parameters": ns.parameters,
            "--resources": ns.resources,
        },
        {"--output": ns.output, "--profile": ns.profile},
    )
    for path in code_files(ns.target):
        refuse_to_clobber({"TARGET": path}, {"--output": ns.output, "--profile": ns.profile})
    if ns.profile not in (None, "-"):
        check_writable("--profile", Path(ns.profile))


def refuse_to_clobber(reads: dict[str, str | None], writes: dict[str, str | None]) -> None:
    """Refuse a file a command writes that is one it reads (``-`` being stdin): writing
    it would destroy what it holds, an input file, a dataset, the learned parameters.

    Every command that writes a file checks with this, before it opens anything.
    """
    for flag, target in writes.items():
        if target in (None, "-"):
            continue
        for source_flag, source in reads.items():
            if source is None:
                continue
            what = {"--input": "input file", "TARGET": "pipeline's source file"}.get(
                source_flag, f"{source_flag} file"
            )
            if source == "-":
                if _is_stdin(Path(target)):
                    raise UsageError(
                        f"{flag} {target} is the file stdin reads the inputs from: writing it "
                        f"would destroy the inputs before they are read; give {flag} another path"
                    )
            elif Path(source).is_dir():
                if _same_file(Path(target).parent, Path(source)):
                    raise UsageError(
                        f"{flag} {target} is inside the input directory {source}, each file of "
                        f"which is an input: the next run would read it as one; give {flag} a "
                        "path outside it"
                    )
            elif _same_file(Path(source), Path(target)):
                raise UsageError(
                    f"{flag} {target} is the {what} {source}: writing it would destroy "
                    f"what it holds; give {flag} another path"
                )


def _is_stdin(path: Path) -> bool:
    """Whether ``path`` is the file standard input was redirected from."""
    try:
        stdin, target = os.fstat(0), os.stat(path)
    except OSError:  # no stdin, or the path does not exist yet
        return False
    return (stdin.st_dev, stdin.st_ino) == (target.st_dev, target.st_ino)


def check_writable(flag: str, path: Path) -> None:
    """A file the run writes only at its end must be writable before the run pays for
    anything: a directory, or a place that refuses files, is a usage error now."""
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a directory; give the path of a file")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise UsageError(
            f"cannot write {flag} {path} ({exc.strerror or exc}); choose a path in a "
            "directory you can write to"
        ) from None
    if not existed:
        with contextlib.suppress(OSError):
            path.unlink()  # only a probe: the file is written when the run ends


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)  # links and hard links too
    except OSError:  # one of them does not exist yet
        return a.resolve() == b.resolve()


def _interactive(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False
