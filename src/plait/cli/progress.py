"""How far a run has got: a live rich display on a terminal, plain lines otherwise.

The counters are written on plait's runtime loop thread (as results arrive) and
read by a display thread; each is a single int assignment, so a display may be a
moment behind but never sees a torn value.  Tokens and cost come from the
process-wide usage counters, which the run resets when it starts.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import IO, Any

from rich.console import Console, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from plait.resources.usage import usage

__all__ = [
    "Display",
    "PlainDisplay",
    "RichDisplay",
    "Tally",
    "call_sites",
    "console",
    "is_terminal",
    "make_display",
]

#: Plain progress lines: at most this far apart in time...
PLAIN_INTERVAL_S = 2.0
#: ...and one whenever another tenth of a known total has finished.
PLAIN_STEPS = 10
#: No ETA before this many inputs finished in this run (see `Tally.eta`).
MIN_ETA_INPUTS = 5
#: Pending batches named by id on a progress line; the rest are counted.
BATCHES_SHOWN = 3


class Tally:
    """Counts of one run, and what a display derives from them (rate, ETA, spend)."""

    def __init__(self, total: int | None = None) -> None:
        self.total = total
        self.succeeded = 0
        self.failed = 0
        #: Inputs answered from the checkpoint: finished by an earlier run.
        self.resumed = 0
        self.in_flight = 0
        self.started = time.monotonic()
        self.failures: list[tuple[int, dict[str, Any]]] = []
        #: The LLM calls one input makes, as the pipeline's modules say (`call_sites`),
        #: so a display shows how far the calls are before any input has finished.
        self.calls_per_input: int | None = None

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def rate(self) -> float | None:
        """Inputs per second computed by this run (resumed ones cost no time)."""
        elapsed = self.elapsed()
        fresh = self.finished - self.resumed
        if fresh <= 0 or elapsed <= 0:
            return None
        return fresh / elapsed

    def eta(self) -> float | None:
        """The time left, once the rate means something: at least `MIN_ETA_INPUTS`
        inputs, and a whole window of the inputs run at once, finished in this run.
        Before that, inputs all started together and none has finished yet, so the
        rate (and an ETA from it) swings by orders of magnitude."""
        rate = self.rate()
        if self.total is None or rate is None:
            return None
        if self.finished - self.resumed < max(MIN_ETA_INPUTS, self.in_flight):
            return None
        return max(0, self.total - self.finished) / rate

    @staticmethod
    def calls() -> tuple[int, int]:
        """LLM calls finished (answered or given up on) and requests on the wire now: a
        run of a few long inputs moves here long before an input finishes."""
        done = sending = 0
        for row in usage().rows:
            done += row["succeeded"] + row["failed"]
            sending += row["requests"] - row["succeeded"] - row["failed"] - row["retries"]
        return done, max(0, sending)

    def expected_calls(self) -> int | None:
        """The calls this run should make: those of each input it runs (not of those
        answered from the checkpoint); None when unknown, or once the calls made exceed
        it (a call site run in a loop, more than once per input)."""
        if self.total is None or not self.calls_per_input:
            return None
        expected = self.calls_per_input * max(0, self.total - self.resumed)
        done, sending = self.calls()
        return expected if expected > 0 and done + sending <= expected else None

    def completed(self) -> float:
        """How many inputs' worth of work is done, for a bar: the inputs finished, or
        (while a few long inputs run) the share of the calls done, if that is more."""
        expected = self.expected_calls()
        if expected is None or self.total is None or self.finished >= self.total:
            return float(self.finished)
        done, _ = self.calls()
        by_calls = self.resumed + (self.total - self.resumed) * done / expected
        return max(float(self.finished), min(by_calls, self.total - 0.5))

    @staticmethod
    def spend() -> tuple[int, float | None]:
        tokens, cost = 0, None
        for row in usage().rows:
            tokens += row["prompt_tokens"] + row["completion_tokens"]
            if row["cost_usd"] is not None:
                cost = (cost or 0.0) + row["cost_usd"]
        return tokens, cost

    def headline(self) -> str:
        """How far: inputs finished, the rate, and the time left when the total is known."""
        if self.total is not None:
            share = f" ({100 * self.finished // self.total}%)" if self.total else ""
            parts = [f"{self.finished}/{self.total} inputs{share}"]
        else:
            parts = [f"{self.finished} inputs"]
        done, sending = self.calls()
        expected = self.expected_calls()
        if expected is not None and self.finished < (self.total or 0):
            parts.append(f"calls: {done} of ~{expected} done, {sending} sending")
        elif done or sending:
            parts.append(f"calls: {done} done, {sending} sending")
        rate = self.rate()
        if rate is not None:
            parts.append(f"{rate:.1f}/s")
        eta = self.eta()
        if eta is not None and self.finished < (self.total or 0):
            parts.append(f"ETA {duration(eta)}")
        return " · ".join(parts)

    @staticmethod
    def batches() -> str | None:
        """Where a batch-API run's calls are: the batches pending at the provider, by
        id (what to look up there), and the calls gathering for the next; None when no
        batch run is going on."""
        if "plait.resources.batching" not in sys.modules:  # no batch run was ever made
            return None
        from plait.resources.batching import batches_in_flight

        found = batches_in_flight()
        if found is None:
            return None
        shown = [f"{batch_id} ({alias}, {calls} calls)" for alias, batch_id, calls in found.pending]
        more = f", +{len(shown) - BATCHES_SHOWN} more" if len(shown) > BATCHES_SHOWN else ""
        parts = [
            f"{len(shown)} batch(es) pending at the provider"
            + (f": {', '.join(shown[:BATCHES_SHOWN])}{more}" if shown else "")
        ]
        if found.submitting:
            parts.append(f"{found.submitting} being submitted")
        if found.waiting:
            parts.append(f"{found.waiting} call(s) gathering for the next batch")
        return " · ".join(parts)

    def details(self) -> str:
        """How it goes: failures, work in flight, resumed inputs, spend, time so far."""
        parts = [f"{self.failed} failed", f"{self.in_flight} in flight"]
        if self.resumed:
            parts.append(f"{self.resumed} from checkpoint")
        tokens, cost = self.spend()
        parts.append(f"{tokens:,} tokens")
        if cost is not None:
            parts.append(f"${cost:.4f}")
        parts.append(f"elapsed {duration(self.elapsed())}")
        return " · ".join(parts)

    def status(self) -> str:
        batches = self.batches()
        return f"{self.headline()} · {self.details()}" + (f" · {batches}" if batches else "")


def call_sites(module: Any) -> int:
    """The LLM calls one input of ``module`` makes when each call site in its tree runs
    once (``n`` samples counting ``n``): what a display expects before any input ends."""
    return sum(
        getattr(part, "n", 1) for part in module.modules() if getattr(part, "_calls_llm", False)
    )


def duration(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class Display:
    """What a run tells a display: it started, a result arrived, it ended."""

    def __init__(self, tally: Tally, stream: IO[str]) -> None:
        self.tally = tally
        self.stream = stream

    def start(self) -> None:
        pass

    def changed(self) -> None:
        pass

    def stop(self) -> None:
        pass


class RichDisplay(Display):
    """A bar and a status line, redrawn a few times a second by rich's own thread."""

    def __init__(self, tally: Tally, stream: IO[str]) -> None:
        super().__init__(tally, stream)
        from rich.live import Live

        self.console = Console(file=stream)
        self.live = Live(
            get_renderable=self._render,
            console=self.console,
            refresh_per_second=4,
            transient=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )

    def _render(self) -> Table:
        tally = self.tally
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column()
        bar = ProgressBar(total=tally.total, completed=tally.completed(), width=30)
        grid.add_row(bar, Text(tally.headline(), style="bold"))
        grid.add_row("", Text(tally.details(), style="dim"))
        batches = tally.batches()
        if batches:
            grid.add_row("", Text(batches))
        return grid

    def start(self) -> None:
        self.live.start()

    def stop(self) -> None:
        self.live.stop()


class PlainDisplay(Display):
    """Lines for logs and pipes: every few seconds, and at each tenth of a known total."""

    def __init__(
        self,
        tally: Tally,
        stream: IO[str],
        interval: float = PLAIN_INTERVAL_S,
        command: str = "run",
    ) -> None:
        super().__init__(tally, stream)
        self.interval = interval
        self.command = command
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._step = 0
        self._shown = -1  # how many inputs had finished at the last line
        self._thread = threading.Thread(target=self._tick, name="plait-progress", daemon=True)

    def _line(self) -> None:
        with self._lock:
            self._shown = self.tally.finished
            self.stream.write(f"plait {self.command}: {self.tally.status()}\n")
            self.stream.flush()

    def _tick(self) -> None:
        while not self._stopped.wait(self.interval):
            self._line()

    def start(self) -> None:
        self._thread.start()

    def changed(self) -> None:
        total = self.tally.total
        if not total:
            return
        step = self.tally.finished * PLAIN_STEPS // total
        if step > self._step:
            self._step = step
            self._line()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._shown != self.tally.finished:
            self._line()


def console(stream: IO[str]) -> Console:
    """A rich console for ``stream``; in a log or a pipe, wide enough for the usage table."""
    if is_terminal(stream) or "COLUMNS" in os.environ:
        return Console(file=stream)
    return Console(file=stream, width=120)


#: The width a table is measured at to learn how wide its content is, cells unwrapped.
_UNBOUNDED = 10_000


def show(stream: IO[str], renderable: RenderableType) -> None:
    """Print ``renderable`` (a table) on ``stream``.  At a terminal it fits the terminal;
    in a log or a pipe nothing is folded or cut (a model's name is what a reader of a CI
    log looks for): the console is as wide as the content needs, whatever ``COLUMNS``
    says, and never narrower than `console` would be."""
    out = console(stream)
    if not is_terminal(stream):
        needed = out.measure(renderable, options=out.options.update_width(_UNBOUNDED)).maximum
        if needed > out.width:
            out = Console(file=stream, width=needed)
    out.print(renderable)


def is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


def make_display(
    tally: Tally, stream: IO[str], quiet: bool = False, command: str = "run"
) -> Display:
    if quiet:
        return Display(tally, stream)
    if is_terminal(stream):
        return RichDisplay(tally, stream)
    return PlainDisplay(tally, stream, command=command)
