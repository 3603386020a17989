"""Demonstrations: worked examples an `LLMInference` shows the model before its input.

A small model follows what it sees done far better than what it is told: a few
earlier user/assistant turns that answer the way the task wants teach the format
(and often the task) where no instruction does.  So demonstrations are a
learnable value like a prompt: a `Parameter` whose value is a list of
``{"input": ..., "output": ...}`` pairs, which `BootstrapFewShot` fills from
traces that scored well and which ``state_dict()``, snapshots and checkpoints
carry like any other value.

On the wire each pair becomes a user turn (the input) and an assistant turn (the
output), after the system prompt and before the real input, so a cache or a
checkpoint key (a hash of the messages) changes whenever the demonstrations do.

The value may instead be a *pool* chosen from per input, ``{"pool": [pairs...],
"k": 4}`` (`knn_demos`): each call is shown the ``k`` pairs of the pool whose
inputs are most like its own (BM25 word overlap; no model, no endpoint), the most
similar last, nearest the input; with ``embed="alias"``, by the cosine similarity
of the embeddings that alias's endpoint gives (the pool's inputs embedded once per
run, each input once per call).  With ``cover_labels``, a call that answers with
labels (`plait.labels`) is shown at least one pair per label when ``k`` allows
(measured to cost accuracy on a small model, so off by default).  The pool and
``k`` are the parameter's value, so state, checkpoints, ``--parameters`` files and
cache keys (the chosen pairs are in the messages) all see them.

Examples:
    ```python
    import plait

    fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
    resources = plait.ResourceConfig({"fast": fast})
    add = plait.LLMInference(
        "fast",
        system_prompt="Add the numbers.",
        demos=[("2 + 2", "4"), {"input": "3 + 5", "output": "8"}],
    )
    for message in add.messages("1 + 6"):
        print(message["role"], message["content"])
    print(add.bind(resources=resources).run_sync("1 + 6"))
    ```
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from plait.labels import stated_label

__all__ = [
    "DEMOS_DESCRIPTION",
    "DemoError",
    "choose_demos",
    "demo_messages",
    "demo_text",
    "embedding_alias",
    "is_pool",
    "knn_demos",
    "needs_ranking",
    "normalize_demo_value",
    "normalize_demos",
    "required_aliases",
]

DEMOS_DESCRIPTION = (
    "Demonstrations: worked input/output pairs shown to the model as earlier "
    "user/assistant turns, before the real input, to teach the task and the answer's "
    "exact form by example."
)
"""The description of a demonstrations `Parameter`: what an optimizer reads it is for."""


class DemoError(ValueError):
    """A demonstrations value that is neither a list of input/output pairs nor a pool.

    The message names where the value came from and what is wrong with it.
    """


def normalize_demos(
    value: Any, where: str = "demos", labels: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Check a list of demonstrations and give it as ``{"input": ..., "output": ...}`` dicts.

    Accepted: a list (or tuple) whose items are ``(input, output)`` pairs or
    mappings with exactly the keys ``input`` and ``output``.  Both sides must be
    JSON data (text, numbers, lists, dicts), since demonstrations are saved in
    ``state_dict()``, parameter files and checkpoints.

    For a call that answers with labels, an output that states one (`label_of`: any
    case, or the reply's JSON as the wire carries it, ``{"value": "billing"}``, or an
    `Enum` member) becomes that label's text, the one form the call asks the model to
    answer in and a user writes, so that a demonstration reads the same whether a
    user, a file or training made it.

    Args:
        value: The demonstrations.
        where: What the value was given as, for the message.
        labels: The labels of a call that answers with labels (`plait.labels`), or
            None.

    Returns:
        The pairs as dicts, in order.

    Raises:
        DemoError: When ``value`` is not such a list, or a pair has an empty side or
            a side with no JSON form.

    Examples:
        >>> from plait.demos import normalize_demos
        >>> normalize_demos([("2+2?", "4")])
        [{'input': '2+2?', 'output': '4'}]
        >>> normalize_demos([("charged twice", '{"value": "Billing"}')], labels=["billing"])
        [{'input': 'charged twice', 'output': 'billing'}]
    """
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
        raise DemoError(
            f"{where} must be a list of input/output pairs, e.g. "
            f'[{{"input": "2+2?", "output": "4"}}] or [("2+2?", "4")], got '
            f"{type(value).__name__}"
        )
    demos: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        if isinstance(item, Mapping):
            keys = set(item)
            if keys != {"input", "output"}:
                raise DemoError(
                    f"{where}[{index}] must have exactly the keys 'input' and 'output', "
                    f"got {sorted(map(str, keys))}"
                )
            pair = (item["input"], item["output"])
        elif isinstance(item, tuple | list) and len(item) == 2:
            pair = (item[0], item[1])
        else:
            raise DemoError(
                f"{where}[{index}] must be an (input, output) pair or "
                f'{{"input": ..., "output": ...}}, got {_short(item)}'
            )
        pair = (pair[0], demo_answer(pair[1], labels))
        for side, part in zip(("input", "output"), pair, strict=True):
            if part is None or (isinstance(part, str) and not part.strip()):
                raise DemoError(f"{where}[{index}] has an empty {side}: a demonstration needs both")
            if isinstance(part, str):
                continue  # text always has a JSON form (this runs at every call)
            try:
                json.dumps(part)
            except (TypeError, ValueError):
                raise DemoError(
                    f"{where}[{index}]'s {side} is a {type(part).__name__}, which has no JSON "
                    "form: demonstrations are saved with the parameters, so use text or JSON data"
                ) from None
        demos.append({"input": pair[0], "output": pair[1]})
    return demos


def knn_demos(
    k: int = 4, pool: Sequence[Any] = (), cover_labels: bool = False, embed: str | None = None
) -> dict[str, Any]:
    """Demonstrations chosen per input: the ``k`` pairs of ``pool`` most like each call's input.

    Pass the result as ``LLMInference(demos=...)``.  An empty pool is filled by
    training (`BootstrapFewShot` and `DemoSearch` put every pair they gather in
    it).  Pairs are ranked by BM25 word overlap with the input (no model, no
    endpoint), or by the embeddings of ``embed``'s endpoint.

    Args:
        k: How many pairs each call is shown.
        pool: The pairs to choose from: ``(input, output)`` pairs or
            ``{"input": ..., "output": ...}`` dicts.
        cover_labels: A call that answers with labels is shown each label at least
            once when ``k`` allows.  Off by default: on plait's labelling benchmark
            it cost accuracy against the ``k`` most similar pairs
            (``python benchmarks/labels.py``).
        embed: An alias whose endpoint gives embeddings (OpenAI-compatible, e.g.
            ``text-embedding-3-small``); the pairs most like an input are then
            those whose inputs' embeddings are nearest its own.

    Returns:
        The demonstrations value: ``{"pool": [...], "k": k, "cover_labels": ...}``
        (with ``"embed"`` when given).

    Raises:
        DemoError: When ``k`` is not a positive integer, a pair is malformed or
            ``embed`` is empty.

    Examples:
        ```python
        import plait

        fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
        resources = plait.ResourceConfig({"fast": fast})
        pool = [
            ("My card was charged twice.", "billing"),
            ("The app crashes on start.", "technical"),
            ("Refund my last invoice.", "billing"),
            ("Login page shows an error.", "technical"),
        ]
        route = plait.LLMInference(
            "fast", system_prompt="Route the message.", demos=plait.knn_demos(k=2, pool=pool)
        )
        shown = route.messages("Refund my card, it was charged twice.")
        print([m["content"] for m in shown if m["role"] == "user"])
        print(route.bind(resources=resources).run_sync("Refund my card, it was charged twice."))
        ```
    """
    spec: dict[str, Any] = {"pool": list(pool), "k": k, "cover_labels": cover_labels}
    if embed is not None:
        spec["embed"] = embed
    value: dict[str, Any] = normalize_demo_value(spec, "knn_demos(...)")
    return value


def is_pool(value: Any) -> bool:
    """Whether a demonstrations value is a pool chosen from per input.

    Args:
        value: A demonstrations value.

    Returns:
        True for a pool (`knn_demos`), False for a list of pairs.
    """
    if value is None or type(value) is list:  # most calls: no ABC check on their path
        return False
    return isinstance(value, Mapping) and "pool" in value


def normalize_demo_value(
    value: Any, where: str = "demos", labels: Sequence[str] | None = None
) -> Any:
    """Check a demonstrations value: a list of pairs, or a pool chosen from per input.

    Args:
        value: A list of pairs (`normalize_demos`), or a pool ``{"pool": [pairs...],
            "k": k, "cover_labels": false, "embed": "alias"}`` (the last two
            optional: false, and absent for BM25).
        where: What the value was given as, for the message.
        labels: The labels of a call that answers with labels: answers that state
            one are normalized to it.

    Returns:
        The value with its pairs normalized.

    Raises:
        DemoError: When the value is neither, or a part of it is malformed.
    """
    if not isinstance(value, Mapping):
        return normalize_demos(value, where, labels)
    keys = set(value)
    if not {"pool", "k"} <= keys <= {"pool", "k", "cover_labels", "embed"}:
        raise DemoError(
            f"{where} must be a list of input/output pairs or a pool "
            f'{{"pool": [...], "k": 4}} (knn_demos(k=4)), got the keys {sorted(map(str, keys))}'
        )
    k = value["k"]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise DemoError(
            f"{where}'s k is how many pairs each call is shown: a positive integer, got {k!r}"
        )
    cover = value.get("cover_labels", False)
    if not isinstance(cover, bool):
        raise DemoError(f"{where}'s cover_labels must be true or false, got {cover!r}")
    checked = {
        "pool": normalize_demos(value["pool"], f"{where}'s pool", labels),
        "k": k,
        "cover_labels": cover,
    }
    if "embed" in value:
        embed = value["embed"]
        if not isinstance(embed, str) or not embed.strip():
            raise DemoError(
                f"{where}'s embed is the alias whose embeddings rank the pool: a non-empty "
                f"string, got {embed!r} (leave it out to rank by BM25)"
            )
        checked["embed"] = embed
    return checked


def embedding_alias(value: Any) -> str | None:
    """The alias whose embeddings rank a pool, if any.

    Args:
        value: A demonstrations value.

    Returns:
        The alias, or None (a list, or a pool ranked by BM25).
    """
    if not is_pool(value):
        return None
    embed = value.get("embed")
    return embed if isinstance(embed, str) else None


def required_aliases(module: Any) -> set[str]:
    """Every alias a run of ``module`` calls: what its resources must configure.

    Runs check these before anything is paid for (an embedding alias found missing
    at the first call would fail every input).

    Args:
        module: The pipeline.

    Returns:
        The aliases its LLM calls name, and those whose embeddings rank a
        demonstration pool of theirs.
    """
    from plait.module import llm_aliases
    from plait.parameter import Parameter

    found = llm_aliases(module)
    for part in module.modules():
        demos = getattr(part, "demos", None)
        alias = embedding_alias(demos.value if isinstance(demos, Parameter) else demos)
        if alias is not None:
            found.add(alias)
    return found


def needs_ranking(value: Any) -> bool:
    """Whether a call must rank ``value``'s pool to choose from it.

    Args:
        value: A demonstrations value.

    Returns:
        True for a pool with more pairs than ``k``.
    """
    return is_pool(value) and len(value["pool"]) > value["k"]


def choose_demos(
    value: Any,
    prompt: str,
    labels: Sequence[str] | None = None,
    where: str = "demos",
    similarity: Sequence[float] | None = None,
) -> list[dict[str, Any]]:
    """The pairs a call with input ``prompt`` is shown.

    A call that answers with ``labels`` is shown each answer that states a label as
    the label (`normalize_demos`), however the value was set.

    Args:
        value: A demonstrations value: a list of pairs, or a pool.
        prompt: The call's input text.
        labels: The call's labels, when it answers with labels (a pool with
            ``cover_labels`` then shows each when ``k`` allows).
        where: What the value was given as, for the message.
        similarity: Each pool pair's similarity to ``prompt`` as the pool's
            ``embed`` alias measured it (a pool ranked by embeddings needs it; BM25
            is used without).

    Returns:
        A list as it is; for a pool, its ``k`` pairs most like ``prompt``, least
        similar first (the most similar nearest the input).

    Raises:
        DemoError: When the value is malformed, the similarities do not match the
            pool, or a pool ranked by embeddings has none.
    """
    if not is_pool(value):
        return normalize_demos(value, where, labels)
    checked, index = _pool_index(value, where, labels)
    pool: list[dict[str, Any]] = checked["pool"]
    k: int = checked["k"]
    if len(pool) <= k:
        return pool
    if similarity is not None:
        if len(similarity) != len(pool):
            raise DemoError(
                f"{where}: {len(similarity)} similarities for a pool of {len(pool)} pairs"
            )
        scores = list(similarity)
    elif "embed" in checked:
        raise DemoError(
            f"{where} are ranked by the embeddings of alias {checked['embed']!r}, which "
            "only a call run by plait's runtime fetches (module(...), run_sync, plait run)"
        )
    else:
        scores = index.scores(prompt)
    ranked = sorted(range(len(pool)), key=lambda i: (-scores[i], i))
    chosen: list[int] = []
    if labels and checked["cover_labels"]:
        covered: set[str] = set()
        for i in ranked:  # the most similar pair of each label, most similar first
            label = label_of(pool[i]["output"], labels)
            if label is not None and label not in covered and len(chosen) < k:
                covered.add(label)
                chosen.append(i)
    taken = set(chosen)
    for i in ranked:
        if len(chosen) >= k:
            break
        if i not in taken:
            chosen.append(i)
    chosen.sort(key=lambda i: (scores[i], -i))  # the most similar nearest the input
    return [pool[i] for i in chosen]


#: The pools seen lately, checked and indexed, by the identity of the value they came
#: from (kept in the entry, so an identity is not reused while it lives): a call reads
#: the same value every time until training replaces it.
_POOLS: dict[int, tuple[Any, tuple[Any, ...], dict[str, Any], Any]] = {}
_MAX_POOLS = 64


def _pool_index(
    value: Any, where: str, labels: Sequence[str] | None = None
) -> tuple[dict[str, Any], Any]:
    """The checked pool ``value`` (answers that state one of ``labels`` as that label)
    and a BM25 index of its pairs' inputs."""
    from plait.retrieval import BM25

    raw = value["pool"]
    size = len(raw) if isinstance(raw, Sequence) else -1
    shape = (size, value["k"], value.get("cover_labels"), tuple(labels or ()))
    found = _POOLS.get(id(value))
    if found is not None and found[0] is value and found[1] == shape:
        return found[2], found[3]
    checked = normalize_demo_value(value, where, labels)
    index = BM25([demo_text(pair["input"]) for pair in checked["pool"]])
    if len(_POOLS) >= _MAX_POOLS:
        _POOLS.pop(next(iter(_POOLS)))
    _POOLS[id(value)] = (value, shape, checked, index)
    return checked, index


def demo_answer(output: Any, labels: Sequence[str] | None) -> Any:
    """A demonstration's ``output`` as a call answering with ``labels`` shows it: the
    label it states (`label_of`) as the label's text; anything else (and every output
    of a call without labels) as it is."""
    if not labels:
        return output
    label = label_of(output, labels)
    return output if label is None else label


def label_of(output: Any, labels: Sequence[str]) -> str | None:
    """Which of ``labels`` a demonstration's ``output`` states, or None.

    Any case, quotes and punctuation around it, the reply's JSON
    ``{"value": "billing"}`` and an `Enum` member all state a label
    (`plait.labels.stated_label`). Demonstrations are normalized, and pools and
    searches tell which label a pair shows, this way.

    Args:
        output: The demonstration's output.
        labels: The call's labels.

    Returns:
        The label, or None when the output states none of them.
    """
    return stated_label(output, labels)


def demo_text(part: Any) -> str:
    """One side of a demonstration as the model reads it: text as is, data as JSON.

    Args:
        part: An input or an output.

    Returns:
        The text.
    """
    if isinstance(part, str):
        return part
    return json.dumps(part, ensure_ascii=False)


def demo_messages(demos: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The user/assistant turns that show ``demos``, in order.

    Args:
        demos: Normalized pairs (`normalize_demos`).

    Returns:
        A user message (the input) then an assistant message (the output) per pair.
    """
    turns: list[dict[str, Any]] = []
    for demo in demos:
        turns.append({"role": "user", "content": demo_text(demo["input"])})
        turns.append({"role": "assistant", "content": demo_text(demo["output"])})
    return turns


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
