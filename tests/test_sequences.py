"""Sequences (issue 14 points 1-3): `Recurrence` scans, `Refine`, `MapReduce`, `chunk_text`.

The calls go to the loopback fake server, whose reply echoes the last user message
behind ``[<system prompt>] ``: a step's output shows exactly which state and item it
was given.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.handlers import mock
from plait.learning import TrainingStep
from plait.learning.losses import FunctionLoss
from plait.sequences import MapReduce, Recurrence, Refine, WordPieces, chunk_text
from plait.sequences.chunking import _spans
from plait.testing import FakeOpenAIServer

from .test_execution import gated, wait_until

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TEXT = (
    "The first paragraph opens the story. It has two sentences.\n\n"
    "The second paragraph is a little longer than the first one. It adds a fact! "
    "Does it end with a question?\n\nA short third one."
)


# -- chunking -------------------------------------------------------------------------------
def test_chunks_cover_the_text_in_order_and_stay_within_the_size() -> None:
    chunks = chunk_text(TEXT, 60)
    assert "".join(chunks) == TEXT
    assert all(len(chunk) <= 60 for chunk in chunks)
    # The first cut falls at the paragraph break, not mid-sentence.
    assert chunks[0].endswith("two sentences.\n\n")


def test_overlapping_chunks_share_text_and_start_on_a_word() -> None:
    chunks = chunk_text(TEXT, 70, 20)
    spans = _spans(list(TEXT), 70, 20)
    assert len(chunks) >= 3 and chunks == [TEXT[a:b] for a, b in spans]
    for (start, end), (after, _) in itertools.pairwise(spans):
        # The next chunk starts inside the previous one (at most 20 back), at a word.
        assert start + 25 <= after < end <= after + 20 and TEXT[after - 1].isspace()
        assert TEXT[after].isalnum()


def test_token_chunks_count_word_pieces_or_a_given_tokenizer() -> None:
    chunks = chunk_text(TEXT, 12, unit="tokens")
    assert "".join(chunks) == TEXT
    assert all(len(WordPieces().encode(chunk)) <= 12 for chunk in chunks)

    class Letters:
        def encode(self, text: str) -> list[str]:
            return list(text)

        def decode(self, tokens: Any) -> str:
            return "".join(tokens)

    assert chunk_text("abcdefghij", 4, unit="tokens", tokenizer=Letters()) == [
        "abcd",
        "efgh",
        "ij",
    ]


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        (("x", 0), {}, ValueError, "size must be an integer >= 1"),
        (("x", 10, 10), {}, ValueError, "overlap .* must be smaller than size"),
        (("x", 10, 25), {}, ValueError, "overlap .* must be smaller than size"),
        (("x", 10, -1), {}, ValueError, "overlap must be an integer >= 0"),
        ((b"x", 10), {}, TypeError, "takes text"),
        (("x", 10), {"unit": "words"}, ValueError, "unit must be"),
    ],
)
def test_chunking_refuses_bad_arguments(
    args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        chunk_text(*args, **kwargs)


def test_a_blank_text_has_no_chunks() -> None:
    assert chunk_text("  \n ", 10) == []


def _random_text(rng: random.Random) -> str:
    """Words of 1-12 letters (now and then one of 20-40) between spaces, sentence
    ends and paragraph breaks."""
    parts: list[str] = []
    for _ in range(rng.randrange(1, 120)):
        length = rng.randrange(20, 40) if rng.random() < 0.03 else rng.randrange(1, 12)
        parts.append("".join(rng.choice("abcdefghij") for _ in range(length)))
        parts.append(rng.choice([" "] * 8 + [". ", "\n\n", "! ", "  "]))
    return "".join(parts)


#: What `chunk_text` takes for a sentence end: a paragraph break, or ``.``, ``!`` or
#: ``?`` (and any closing quotes or brackets) before a space.
_SENTENCE_ENDS = (re.compile(r"\n\s*\n"), re.compile(r"[.!?][\"')\]]*\s"))


def _check_chunks(text: str, size: int, overlap: int) -> list[tuple[int, int]]:
    """What `chunk_text` promises, checked on its spans; returns them.

    In order and covering the whole text; none over ``size``; each starting at least
    ``(size - overlap) // 2`` after the one before; consecutive ones sharing at most
    ``overlap`` characters and, with an overlap, at least one whole word when the text
    has a word that short near the cut (else exactly ``overlap`` characters); each
    ending at a sentence end when one ends in reach (its window's last ``(size -
    overlap) // 2``), else at a space when one is there."""
    spans = _spans(list(text), size, overlap)
    reach = max(1, (size - overlap) // 2)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    for (start, end), (after, after_end) in itertools.pairwise(spans):
        assert 0 < end - start <= size and after_end - after <= size
        assert start + (size - overlap) // 2 <= after <= end < after_end  # no gap, in order
        shared = text[after:end]
        assert len(shared) <= overlap
        if overlap == 0:
            assert after == end
        else:
            assert shared, (start, end, after)
            begin = max(end - overlap, start + 1)
            word_starts = [i for i in range(begin, end) if _starts_word(text, i)]
            if word_starts:  # the next chunk starts at the first of them
                assert after == word_starts[0]
                if text[end - 1].isspace():  # cut at a break: a whole word in common
                    assert shared.split(), shared
            else:  # no word to share: `overlap` characters are
                assert after == begin
        # Where the chunk could have ended: in reach, and leaving a word to share.
        window = text[start : start + size]
        fits = {
            cut
            for cut in range(len(window) - reach + 1, len(window) + 1)
            if overlap == 0
            or any(
                _starts_word(text, i)
                for i in range(max(start + cut - overlap, start + 1), start + cut)
            )
        }
        sentence_ends = {m.end() for kind in _SENTENCE_ENDS for m in kind.finditer(window)}
        if sentence_ends & fits:
            assert end - start in sentence_ends, (window, end - start)
        elif any(window[cut - 1].isspace() for cut in fits):
            assert text[end - 1].isspace(), (window, end - start)
    chunks = chunk_text(text, size, overlap)
    assert chunks == [text[a:b] for a, b in spans if text[a:b].strip()]
    assert all(len(chunk) <= size for chunk in chunks)
    return spans


def _starts_word(text: str, i: int) -> bool:
    return not text[i].isspace() and (i == 0 or text[i - 1].isspace())


@pytest.mark.parametrize("seed", range(300))
def test_chunks_cover_the_text_overlap_by_a_word_and_end_at_sentences(seed: int) -> None:
    """Random texts, sizes and overlaps: every promise of `chunk_text` holds."""
    rng = random.Random(seed)
    text = _random_text(rng)
    size = rng.randrange(1, 120)
    _check_chunks(text, size, rng.randrange(0, size))


#: A document of short sentences, as a user's would be.
DOCUMENT = (
    "The river port of Lenz grew up around a ford. Traders crossed there for salt. "
    "A wooden bridge replaced the ford in 1412. It burned twice in the next century. "
    "The stone bridge that stands today was finished in 1587. Its nine arches are low. "
    "Barges had to lower their masts to pass under them. Tolls paid for the upkeep. "
    "In 1702 a flood carried away two arches. The town rebuilt them within a year. "
    "Merchants from the coast brought cloth and spices. Farmers from the hills brought "
    "wool. The market square filled every Thursday. Disputes were settled at the town "
    "hall. A canal opened in 1821 and took most of the barge traffic. The port declined. "
    "Warehouses stood empty for decades. Some became schools, others workshops. "
    "The railway arrived in 1868. A station was built on the old salt quay. "
    "Tourists came to see the bridge and the painted houses. Inns opened along the river. "
    "Today the port is a marina. Rowing clubs train there at dawn. "
    "The bridge is closed to cars. Children fish from its arches in summer."
)


def test_chunks_of_200_with_40_overlap_share_words_and_end_at_sentences() -> None:
    """``chunk_text(doc, 200, 40)``: consecutive chunks share at least a word and at
    most 40 characters, and each ends at a sentence end, one being in reach (was: a
    pair sharing nothing, and a cut mid-sentence)."""
    chunks = chunk_text(DOCUMENT, 200, 40)
    spans = _check_chunks(DOCUMENT, 200, 40)
    assert len(chunks) == len(spans) >= 5
    for before, after in itertools.pairwise(chunks):
        assert before.endswith(". ")
        shared = next(n for n in range(40, 0, -1) if before.endswith(after[:n]))
        assert after[:shared].split()  # at least one word, read again
    assert chunks[-1].endswith("in summer.")


@pytest.mark.parametrize(
    ("text", "size", "overlap"),
    [
        ("x" * 500, 100, 30),  # no spaces at all
        ("y" * 37, 10, 9),
        ("short " + "w" * 300 + " tail words here. " * 5, 60, 15),  # a word longer than size
        (" ".join("z" * n for n in (50, 3, 80, 2, 45, 7) * 4), 70, 20),  # words over overlap
        ("Über die Straße, naïve café. 東京は大きい。 Emoji 🎉 fin! " * 12, 45, 12),
        ("\n\n".join(["A paragraph of words. Two sentences here."] * 8), 64, 16),
        (DOCUMENT, 200, 0),
        (DOCUMENT, 97, 96),
        (DOCUMENT, 1, 0),
        (DOCUMENT, 2, 1),
        (DOCUMENT, len(DOCUMENT) + 5, 10),
    ],
    ids=[
        "no-spaces",
        "no-spaces-overlap-size-1",
        "word-over-size",
        "words-over-overlap",
        "unicode",
        "paragraphs",
        "no-overlap",
        "overlap-size-1",
        "size-1",
        "size-2",
        "one-chunk",
    ],
)
def test_chunk_promises_hold_on_awkward_texts(text: str, size: int, overlap: int) -> None:
    spans = _check_chunks(text, size, overlap)
    if " " not in text:
        assert all(end - after == overlap for (_, end), (after, _) in itertools.pairwise(spans))


def test_an_empty_text_has_no_chunks_with_or_without_overlap() -> None:
    assert chunk_text("", 10) == [] and chunk_text("", 10, 3) == []


def test_token_chunks_advance_by_the_step_too() -> None:
    document = (EXAMPLES / "data" / "long_document.txt").read_text(encoding="utf-8")
    pieces = WordPieces().encode(document)
    spans = _spans(pieces, 80, 50)
    assert spans[0][0] == 0 and spans[-1][1] == len(pieces)
    for (start, end), (after, after_end) in itertools.pairwise(spans):
        assert after - start >= 15 and after < end < after_end and end - start <= 80
        assert end - after <= 50  # the overlap, in tokens
        assert pieces[after - 1][-1].isspace()  # a word piece after a space: a word start
    assert len(chunk_text(document, 80, 50, unit="tokens")) == len(spans)


def test_the_bundled_document_makes_about_one_chunk_per_step() -> None:
    document = (EXAMPLES / "data" / "long_document.txt").read_text(encoding="utf-8")
    assert len(document) == 2413
    # Was 547 chunks (300, 200) and 199 (100, 60), each one character after the last.
    assert len(chunk_text(document, 300, 200)) <= 2413 // 100 + 1
    assert len(chunk_text(document, 100, 60)) <= 2413 // 40 + 1
    for before, after in itertools.pairwise(chunk_text(document, 300, 200)):
        assert after[0].isalnum() and before[before.index(after[:20]) - 1].isspace()


# -- Recurrence -----------------------------------------------------------------------------
class Running(Recurrence):
    """Each step cleans its item (independent of the state), then folds it in."""

    def __init__(self, start: str = "start", static: bool = True) -> None:
        super().__init__(static=static)
        self.start = start
        self.clean = plait.LLMInference("fast", "Clean.")
        self.fold = plait.LLMInference("fast")

    def initial_state(self, items: Any) -> Any:
        return self.start

    def step(self, item: Any, state: Any) -> tuple[Any, Any]:
        new = self.fold(f"{state}+{self.clean(item)}")
        return new, new


@pytest.mark.parametrize("static", [True, False])
def test_a_scan_carries_the_state_and_restarts_it_at_resets(
    static: bool, resources: plait.ResourceConfig
) -> None:
    scan = Running(static=static).bind(resources=resources)
    ((outputs, final),) = scan.run_sync([["a", "b", "c"]])
    assert outputs == ["start+[Clean.] a", "start+[Clean.] a+[Clean.] b", final]
    assert final == "start+[Clean.] a+[Clean.] b+[Clean.] c"
    ((reset_outputs, reset_final),) = scan.run_sync(
        [["a", "b", "c", "d"]], resets=[True, False, True, False]
    )
    assert reset_outputs[1] == "start+[Clean.] a+[Clean.] b"
    assert reset_outputs[2] == "start+[Clean.] c" and reset_final == "start+[Clean.] c+[Clean.] d"


def test_a_static_scan_starts_later_steps_independent_work_early(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    # The first fold is parked at the server; every clean call, which needs no state,
    # still reaches it: the scan is one graph, not a loop of waits.
    scan = Running(start=gated("start")).bind(resources=resources)
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(scan.run_sync, [["a", "b", "c", "d"]])
        try:
            server.wait_parked("g", 1)
            wait_until(lambda: server.stats()["requests_total"] == 5, "4 cleans and 1 fold")
            cleaned = [
                r["body"]["messages"][-1]["content"]
                for r in server.stats(bodies=True)["requests"]
                if r["body"]["messages"][0]["content"] == "Clean."
            ]
            assert sorted(cleaned) == ["a", "b", "c", "d"]
        finally:
            server.open_gate("g")
        ((outputs, final),) = future.result(timeout=120)
    assert final.endswith("+[Clean.] d") and len(outputs) == 4


def test_a_batch_of_sequences_runs_as_one_batch_under_the_limits(
    server: FakeOpenAIServer,
) -> None:
    from .conftest import make_resources

    scan = Running().bind(resources=make_resources(server, max_concurrent=3))
    results = scan.run_sync([[f"s{i}-{t}" for t in range(3)] for i in range(6)])
    assert [final for _, final in results] == [
        f"start+[Clean.] s{i}-0+[Clean.] s{i}-1+[Clean.] s{i}-2" for i in range(6)
    ]
    stats = server.stats()
    assert stats["requests_total"] == 6 * 3 * 2 and stats["max_in_flight"] <= 3


class StopAtX(Running):
    def should_stop(self, output: Any, state: Any) -> bool:
        return "x" in output


def test_a_dynamic_scan_stops_on_what_a_step_returned(resources: plait.ResourceConfig) -> None:
    scan = StopAtX(static=False).bind(resources=resources)
    ((outputs, final),) = scan.run_sync([["a", "x", "b", "c"]])
    assert outputs == ["start+[Clean.] a", "start+[Clean.] a+[Clean.] x"] and final == outputs[-1]
    with pytest.raises(TypeError, match="needs real values: build it with static=False"):
        StopAtX().apply(["a"])


def test_a_dynamic_scan_reads_a_sequence_an_earlier_call_produced(
    resources: plait.ResourceConfig,
) -> None:
    class Split(plait.Module):
        async def forward(self, text: str) -> Any:
            return text.split()

    class Pipeline(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.split = Split()
            self.scan = Running(static=False)

        def forward(self, text: str) -> Any:
            return self.scan(self.split(text))

    ((_, final),) = Pipeline().bind(resources=resources).run_sync(["p q"])
    assert final == "start+[Clean.] p+[Clean.] q"


def test_bad_scans_are_clear_errors(resources: plait.ResourceConfig) -> None:
    scan = Running().bind(resources=resources)
    with pytest.raises(plait.ExecutionError, match="scans a list or tuple of items, got str"):
        scan.run_sync("abc")
    (failed,) = scan.run_sync([["a", "b"]], resets=[True])
    assert failed.is_error and "got 1 reset flag(s) for 2 item(s)" in str(failed.payload)

    class NoPair(Running):
        def step(self, item: Any, state: Any) -> Any:
            return self.fold(item)

    with pytest.raises(plait.ExecutionError, match=r"step\(\) must return \(output, new_state\)"):
        NoPair().bind(resources=resources).run_sync(("a",))


# -- Refine and MapReduce -------------------------------------------------------------------
def test_refine_carries_a_running_summary_through_every_chunk(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    refine = Refine("fast", "Update.", chunk_size=60, overlap=0).bind(resources=resources)
    summary = refine.run_sync(TEXT)
    chunks = chunk_text(TEXT, 60)
    assert server.stats()["requests_total"] == len(chunks)
    # The echo nests: the last prompt holds the summary of everything before it.
    assert summary.startswith("[Update.] Summary so far:\n[Update.] Summary so far:")
    assert chunks[-1] in summary and "(nothing yet)" in summary


def test_map_reduce_combines_in_a_tree_within_the_fan_in(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    chunks = [f"part {n}" for n in range(7)]
    reduce = MapReduce("fast", "Map.", "Combine.", fan_in=3).bind(resources=resources)
    result = reduce.run_sync([chunks])[0]
    combines = [
        r["body"]["messages"][-1]["content"]
        for r in server.stats(bodies=True)["requests"]
        if r["body"]["messages"][0]["content"] == "Combine."
    ]
    # 7 answers -> 3 combines (3, 3, 1 passes through) -> 1 combine of 3.
    assert len(combines) == 3 and reduce.levels(7) == 2
    assert [c.count("Part ") for c in combines[:2]] == [3, 3]  # the first round
    assert combines[2].startswith("Part 1:\n[Combine.] Part 1:") and "\n\nPart 3:\n" in combines[2]
    assert all(f"[Map.] part {n}" in result for n in range(7))


def test_map_reduce_fan_in_keeps_combine_prompts_within_a_budget() -> None:
    assert MapReduce("fast", max_tokens=100, max_prompt_chars=1300, fan_in=8).fan_in == 3
    with pytest.raises(ValueError, match="holds 1 answer"):
        MapReduce("fast", max_tokens=100, max_prompt_chars=500)
    with pytest.raises(ValueError, match="give max_tokens too"):
        MapReduce("fast", max_tokens=None, max_prompt_chars=5000)


# -- learning through a scan -----------------------------------------------------------------
async def test_backward_reaches_the_step_prompt_through_every_step(
    resources: plait.ResourceConfig,
) -> None:
    refine = Refine("fast", plait.Parameter("Update.", description="how to update"))
    loss_fn = FunctionLoss(lambda output, target: (0.0, "the summary misses the ending"))
    step = TrainingStep(refine, loss_fn).bind(resources=resources)
    step.train()
    loss = await step(("one", "two", "three"), target=None)
    await loss.backward()
    received = refine.refine.system_prompt.get_accumulated_feedback()
    # One piece of feedback per step that used the prompt: three steps, three.
    assert len(received) == 3
    assert all("misses the ending" in text for text in received)


async def test_a_dynamic_scan_refuses_to_train_its_prompts(
    resources: plait.ResourceConfig,
) -> None:
    refine = Refine("fast", plait.Parameter("Update.", description="how to update"), static=False)
    step = TrainingStep(refine, FunctionLoss(lambda o, t: (1.0, "ok"))).bind(resources=resources)
    step.train()
    with pytest.raises(plait.ExecutionError, match="build it with static=True to train it"):
        await step(("one", "two"), target=None)


def test_plait_train_improves_a_refine_prompt(resources: plait.ResourceConfig) -> None:
    from plait.learning.losses import Contains
    from plait.learning.optimizers import SFAOptimizer
    from plait.learning.trainer import Trainer

    refine = Refine("fast", plait.Parameter("Update.", description="how to update"))
    optimizer = SFAOptimizer(refine.parameters(), alias="smart")
    data = [(["alpha", "beta"], "KEEP"), (["gamma", "delta"], "KEEP")]
    trainer = Trainer(refine, Contains(), optimizer, data, data, batch_size=2, resources=resources)
    with mock({"rewriter": "Update. KEEP every name."}):
        history = trainer.fit_sync()
    (record,) = history.steps
    assert record.kept and history.best_val_score == 1.0 > history.initial_val_score
    assert refine.refine.system_prompt.value == "Update. KEEP every name."
    assert json.dumps(history.to_json())  # the history is plain data


def test_refine_and_map_reduce_are_exported() -> None:
    assert plait.Refine is Refine and plait.MapReduce is MapReduce
    assert plait.Recurrence is Recurrence and plait.chunk_text is chunk_text
    assert Path(__file__).exists()


def scan_shape(trace: Path) -> dict[str, list[list[str]]]:
    """Each LLM call's upstream calls in a profile, by module path, in node order."""
    events = json.loads(trace.read_text())["traceEvents"]
    calls = sorted(
        (e for e in events if e.get("cat") == "llm"),
        key=lambda e: int(e["args"]["node_id"].split(":")[0]),
    )
    shape: dict[str, list[list[str]]] = {}
    for event in calls:
        shape.setdefault(event["name"], []).append(sorted(event["args"]["upstream"]))
    return shape


def test_the_summarize_example_profiles_as_a_chain_and_as_a_tree(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    from .conftest import plait_cli

    resources = tmp_path / "resources.toml"
    resources.write_text(
        f'[fast]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
        'api_key = "sk-test"\n'
    )
    traces = {}
    for name in ("RefineSummary", "MapReduceSummary"):
        traces[name] = tmp_path / f"{name}.json"
        result = plait_cli(
            "run", f"examples/summarize_long.py:{name}",
            "--input", "examples/data/long_documents.jsonl", "--output", tmp_path / f"{name}.jsonl",
            "--profile", traces[name], "--resources", resources, "-q",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
    # Refine: a chain, each call waiting for the one before.
    refine = scan_shape(traces["RefineSummary"])["refine"]
    assert len(refine) == 6 and refine[0] == []
    assert all(len(upstream) == 1 for upstream in refine[1:])
    # MapReduce: six independent maps, two combines of three, one of the two combines.
    shape = scan_shape(traces["MapReduceSummary"])
    assert shape["map"] == [[]] * 6
    assert [len(upstream) for upstream in shape["combine"]] == [3, 3, 2]
    assert all(u.endswith(":combine") for u in shape["combine"][2])
