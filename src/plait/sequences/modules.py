"""Reading a document longer than one call: `Refine` and `MapReduce`.

* `Refine` reads the chunks in order and carries a running answer (a summary,
  say) from each to the next: one call per chunk, each seeing the answer so far.
  It is a `Recurrence`, so its scan is unrolled into the graph and its prompt
  learns through every step.
* `MapReduce` reads every chunk at once (one call each, all in parallel), then
  combines the answers in a tree of calls, at most ``fan_in`` answers per
  combine, until one is left.  ``max_prompt_chars`` lowers the fan-in so that no
  combine prompt can exceed it (each answer is at most its call's ``max_tokens``).

Both take the whole document as text (chunked with `chunk_text`) or a list of
chunks, and both keep their instructions as learnable `Parameter`s.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from plait.inference import LLMInference
from plait.module import Module
from plait.parameter import Parameter
from plait.sequences.chunking import chunk_text
from plait.sequences.recurrence import Recurrence
from plait.values import Value

__all__ = ["MapReduce", "Refine"]

REFINE_INSTRUCTION = (
    "You keep a running summary of a long document that you read part by part. Given the "
    "summary so far and the next part, write the updated summary: keep what still "
    "matters, add what the new part says. Reply with the summary only."
)
MAP_INSTRUCTION = "Summarize this part of a longer document in a few sentences."
COMBINE_INSTRUCTION = (
    "Combine these summaries of consecutive parts of one document into one summary. "
    "Reply with the summary only."
)
#: Characters a token stands for, to bound a reply's length from its ``max_tokens``.
CHARS_PER_TOKEN = 4
#: What a combine prompt adds around each answer ("Part 3:\n...\n\n").
_PART_OVERHEAD = 16


def _instruction(value: str | Parameter, description: str) -> Parameter:
    if isinstance(value, Parameter):
        return value
    return Parameter(value, description=description)


def _chunks(document: Any, size: int, overlap: int, reader: str) -> Any:
    """A text chunked; a list of chunks (or anything else) as it is.

    An empty document (a list of blank chunks too) is an error for both readers: a
    Refine that returned its initial "(nothing yet)" as a success, where a MapReduce
    of the same input failed, reported a summary of a document that was never
    there. One check for both, so a chunk that is not text (a ``None`` that Refine
    sent as "Next part:\nNone") is refused the same way by each.
    """
    if isinstance(document, str):
        chunks = chunk_text(document, size, overlap)
        if not chunks:
            shown = repr(document) if len(document) <= 20 else f"{len(document)} blank characters"
            raise ValueError(f"{reader} got an empty document ({shown}): nothing to read")
        return chunks
    if isinstance(document, list | tuple):
        if not document:
            raise ValueError(
                f"{reader} got an empty document (an empty {type(document).__name__} of "
                "chunks): nothing to read"
            )
        for position, chunk in enumerate(document):
            # Text, or what an earlier call produces (a traced output, a Value, an
            # awaitable); a None would reach the model as "None" and be paid for.
            if not (isinstance(chunk, str | Value) or inspect.isawaitable(chunk)):
                raise TypeError(
                    f"{reader} got chunk {position} of type {type(chunk).__name__} "
                    f"({_shown(chunk)}) where text is required: a document is a text or a "
                    "list of text chunks"
                )
        if all(type(chunk) is str and not chunk.strip() for chunk in document):
            raise ValueError(
                f"{reader} got an empty document ({len(document)} blank chunk(s)): nothing to read"
            )
    return document  # e.g. a sequence an earlier call will produce: the scan checks it


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


class Refine(Recurrence):
    """Reads a long document chunk by chunk, carrying a running answer (a summary) along.

    One call per chunk, each shown the answer so far and the next chunk:
    ``forward(document)`` returns the final answer.  It is a `Recurrence`, so the
    scan is unrolled into the graph and its instruction learns through every
    step.  The document is a text (cut with `chunk_text`) or a list of chunks
    (used as it is); an empty document is that input's ValueError, and a chunk
    that is not text its TypeError.

    Args:
        alias: The resource alias every step's call goes to.
        instruction: The system prompt of the step's call (a str, learnable by
            default, or a `Parameter`).
        initial: The answer before the first chunk (default "(nothing yet)").
        chunk_size: Characters per chunk.
        overlap: Characters consecutive chunks may share.
        max_tokens: The step call's reply limit.
        temperature: The step call's temperature.
        static: Unroll the scan into the graph (True), or run the steps one after
            the other on real values (see `Recurrence`).

    Raises:
        ValueError: ``chunk_size`` or ``overlap`` is out of range (see `chunk_text`).
        TypeError: ``static`` is not a bool.

    Examples:
        ```python
        import plait
        from plait.sequences import Refine

        resources = plait.ResourceConfig(
            {"fast": plait.EndpointConfig(model="gpt-4o-mini", api_key_env="OPENAI_API_KEY")}
        )
        report = "The parcel left the depot on Monday. " * 30 + "It arrived on Friday. " * 30
        summarize = Refine("fast", chunk_size=600, overlap=60).bind(resources=resources)
        print(summarize.run_sync(report))
        ```
    """

    def __init__(
        self,
        alias: str,
        instruction: str | Parameter = REFINE_INSTRUCTION,
        *,
        initial: str = "",
        chunk_size: int = 2000,
        overlap: int = 200,
        max_tokens: int | None = 256,
        temperature: float | None = 0.0,
        static: bool = True,
    ) -> None:
        super().__init__(static=static)
        chunk_text("check", chunk_size, overlap)  # a bad size is an error now, not mid-run
        self.chunk_size = chunk_size
        self.overlap = overlap
        self.initial = initial
        self.refine = LLMInference(
            alias,
            _instruction(
                instruction,
                "How to update a running summary of a long document from its next part.",
            ),
            temperature=temperature,
            max_tokens=max_tokens,
        )

    def initial_state(self, items: Any) -> Any:
        """The answer before the first chunk.

        Args:
            items: The chunks about to be read.

        Returns:
            ``initial``, or "(nothing yet)".
        """
        return self.initial or "(nothing yet)"

    def step(self, item: Any, state: Any) -> tuple[Any, Any]:
        """Update the answer from the next chunk.

        Args:
            item: The next chunk.
            state: The answer so far.

        Returns:
            The updated answer, as both the step's output and the new state.
        """
        updated = self.refine(f"Summary so far:\n{state}\n\nNext part:\n{item}")
        return updated, updated

    def forward(self, document: Any, state: Any = None, resets: Any = None) -> Any:
        """Read ``document`` and return the final answer.

        Args:
            document: A text, or a list of text chunks.
            state: An answer to start from instead of ``initial``.
            resets: One flag per chunk, True where the answer starts over.

        Returns:
            The answer after the last chunk.

        Raises:
            ValueError: The document is empty.
            TypeError: A chunk is not text.
        """
        chunks = _chunks(document, self.chunk_size, self.overlap, "Refine")
        result = self.apply(chunks, state, resets)
        if self.static:
            return result[1]
        return _final(result)


async def _final(result: Any) -> Any:
    _outputs, state = await result
    return state


class MapReduce(Module):
    """Reads every chunk of a long document at once, then combines the answers in a tree of calls.

    One map call per chunk, all in parallel; then combine calls, each reading at
    most ``fan_in`` answers, until one is left: ``forward(document)`` returns it.
    Faster than `Refine` on a long document (the chunks do not wait for each
    other).  The document is a text (cut with `chunk_text`) or a list of chunks;
    an empty document is that input's ValueError.  Both instructions are
    learnable `Parameter`s.

    Args:
        map_alias: The resource alias of the map calls.
        map_instruction: The map call's system prompt (a str or `Parameter`).
        combine_instruction: The combine call's system prompt.
        combine_alias: The combine calls' alias (default: ``map_alias``).
        fan_in: The most answers one combine call reads, at least 2.
        max_prompt_chars: Lower the fan-in so that no combine prompt can exceed
            this many characters (``fan_in * (max_tokens * 4 + 16)``); needs
            ``max_tokens``.
        chunk_size: Characters per chunk.
        overlap: Characters consecutive chunks may share.
        max_tokens: The map and combine calls' reply limit.
        temperature: The map and combine calls' temperature.

    Raises:
        ValueError: ``fan_in`` is below 2, ``max_prompt_chars`` cannot hold two
            answers or comes without ``max_tokens``, or ``chunk_size`` or
            ``overlap`` is out of range.

    Examples:
        ```python
        import plait
        from plait.sequences import MapReduce

        resources = plait.ResourceConfig(
            {"fast": plait.EndpointConfig(model="gpt-4o-mini", api_key_env="OPENAI_API_KEY")}
        )
        report = "The parcel left the depot on Monday. " * 30 + "It arrived on Friday. " * 30
        summarize = MapReduce("fast", chunk_size=600, fan_in=2).bind(resources=resources)
        print(summarize.run_sync(report))
        ```
    """

    def __init__(
        self,
        map_alias: str,
        map_instruction: str | Parameter = MAP_INSTRUCTION,
        combine_instruction: str | Parameter = COMBINE_INSTRUCTION,
        *,
        combine_alias: str | None = None,
        fan_in: int = 4,
        max_prompt_chars: int | None = None,
        chunk_size: int = 2000,
        overlap: int = 200,
        max_tokens: int | None = 256,
        temperature: float | None = 0.0,
    ) -> None:
        super().__init__()
        chunk_text("check", chunk_size, overlap)
        if isinstance(fan_in, bool) or not isinstance(fan_in, int) or fan_in < 2:
            raise ValueError(f"fan_in must be an integer >= 2, got {fan_in!r}")
        self.chunk_size = chunk_size
        self.overlap = overlap
        self.map = LLMInference(
            map_alias,
            _instruction(map_instruction, "How to summarize one part of a long document."),
            temperature=temperature,
            max_tokens=max_tokens,
        )
        self.combine = LLMInference(
            combine_alias or map_alias,
            _instruction(
                combine_instruction, "How to combine summaries of parts into one summary."
            ),
            temperature=temperature,
            max_tokens=max_tokens,
        )
        self.fan_in = self._fan_in(fan_in, max_prompt_chars, max_tokens)

    @staticmethod
    def _fan_in(fan_in: int, max_prompt_chars: int | None, max_tokens: int | None) -> int:
        if max_prompt_chars is None:
            return fan_in
        if max_tokens is None:
            raise ValueError(
                "max_prompt_chars bounds a combine prompt by its answers' max_tokens: give "
                "max_tokens too"
            )
        per_answer = max_tokens * CHARS_PER_TOKEN + _PART_OVERHEAD
        fits = max_prompt_chars // per_answer
        if fits < 2:
            raise ValueError(
                f"max_prompt_chars={max_prompt_chars} holds {fits} answer(s) of up to "
                f"{max_tokens} tokens; a combine needs room for 2: raise it to at least "
                f"{2 * per_answer} or lower max_tokens"
            )
        return min(fan_in, fits)

    def levels(self, chunks: int) -> int:
        """How many rounds of combine calls a document of ``chunks`` chunks takes.

        Args:
            chunks: The number of chunks (map answers).

        Returns:
            The depth of the combine tree (0 for one chunk).
        """
        return 0 if chunks <= 1 else math.ceil(math.log(chunks, self.fan_in) - 1e-9)

    def forward(self, document: Any) -> Any:
        """Answer every chunk, then combine the answers into one.

        Args:
            document: A text, or a list of text chunks.

        Returns:
            The combined answer.

        Raises:
            ValueError: The document is empty.
            TypeError: The document is neither a text nor a list of chunks, or a
                chunk is not text.
        """
        chunks = _chunks(document, self.chunk_size, self.overlap, "MapReduce")
        if not isinstance(chunks, list | tuple):
            raise TypeError(
                f"MapReduce reads a text or a list of chunks, got {type(chunks).__name__}"
            )
        answers = [self.map(chunk) for chunk in chunks]
        while len(answers) > 1:
            groups = [answers[i : i + self.fan_in] for i in range(0, len(answers), self.fan_in)]
            answers = [group[0] if len(group) == 1 else self._combine(group) for group in groups]
        return answers[0]

    def _combine(self, group: list[Any]) -> Any:
        parts = "\n\n".join(f"Part {n}:\n{answer}" for n, answer in enumerate(group, 1))
        return self.combine(parts)

    def extra_repr(self) -> str:
        """What the module's repr shows inside its parentheses.

        Returns:
            The fan-in.
        """
        return f"fan_in={self.fan_in}"
