"""Choosing a label by log-probability, on any provider that returns them.

The ``"logprob"`` and ``"calibrated"`` label methods (`plait.labels`) are one
mechanism for every provider that has log-probabilities (the embedded model, the
OpenAI-compatible endpoints): ask for one token and its likeliest alternatives,
score each label from them, and answer with the best.  Each provider passes its
own single-attempt ``send`` and keeps a `LabelPriors` for the content-free priors
``"calibrated"`` divides by.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from plait._digest import digest
from plait.labels import CONTENT_FREE, UNSEEN, choose_label, label_scores, normalized
from plait.providers.base import LLMRequest, LLMResponse

__all__ = ["LabelPriors", "remember_prior", "score_labels"]


#: Priors read back from stored replies (a checkpoint, a cache), by prompt key: every
#: provider consults them before measuring, so a resumed run does not pay again for
#: a prior its first run measured.  Keys name the alias, so endpoints do not share.
_REMEMBERED: dict[str, dict[str, float]] = {}


def remember_prior(stored: Mapping[str, Any]) -> None:
    """Keep the prior a stored ``"calibrated"`` reply was divided by (its
    `LLMResponse.label_prior`) for the calls still to be made on that prompt.

    Args:
        stored: The reply's ``label_prior``.
    """
    key, scores = stored.get("key"), stored.get("scores")
    if isinstance(key, str) and isinstance(scores, Mapping):
        _REMEMBERED.setdefault(key, {str(k): float(v) for k, v in scores.items()})


class LabelPriors:
    """The content-free label priors one provider has measured, by the prompt they
    were measured on (the messages before the input).

    Calls of one call site that start together share one measurement: the first
    makes it and the others wait for it, so the prior costs one request per prompt,
    however many calls run at once.  A measurement that fails is not kept; the next
    call tries again.  Safe across event loops: a wait is only shared within one.
    """

    def __init__(self) -> None:
        self._known: dict[str, dict[str, float]] = {}
        self._pending: dict[tuple[str, int], asyncio.Future[dict[str, float]]] = {}

    async def get(
        self, key: str, measure: Callable[[], Awaitable[dict[str, float]]]
    ) -> tuple[dict[str, float], bool]:
        """The prior for ``key`` and whether this call measured it."""
        known = self._known.get(key) or _REMEMBERED.get(key)
        if known is not None:
            return known, False
        loop = asyncio.get_running_loop()
        slot = (key, id(loop))
        waiting = self._pending.get(slot)
        if waiting is not None:
            return await asyncio.shield(waiting), False
        future: asyncio.Future[dict[str, float]] = loop.create_future()
        self._pending[slot] = future
        try:
            prior = await measure()
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a failure nobody else awaited is not logged
            raise
        else:
            self._known[key] = prior
            future.set_result(prior)
            return prior, True
        finally:
            del self._pending[slot]


async def score_labels(
    send: Callable[[LLMRequest], Awaitable[LLMResponse]],
    request: LLMRequest,
    choices: Sequence[str],
    method: str,
    *,
    top_k: int,
    priors: LabelPriors,
    fallback: Callable[[], Awaitable[LLMResponse]],
) -> LLMResponse:
    """The reply to a label request by the ``"logprob"`` or ``"calibrated"`` method:
    ``send`` (one attempt on the provider's wire) is asked for one token and its
    ``top_k`` likeliest alternatives, and the reply's text is the chosen label, with
    each label's probability in ``label_scores``.

    When no listed alternative begins any label (a model set on writing something
    else), ``fallback`` (the provider's ``"grammar"`` request) answers instead:
    never a guess from nothing.
    """
    asked = _scoring_request(request, top_k)
    response = await send(asked)
    top = _first_token_alternatives(response)
    scores = label_scores(top, choices)
    if not _begins_a_label(top, scores):
        return await fallback()
    prior: Mapping[str, float] | None = None
    if method == "calibrated":
        extra: list[LLMResponse] = []

        async def measure() -> dict[str, float]:
            empty = [*request.messages[:-1], {"role": "user", "content": CONTENT_FREE}]
            measured = await send(replace(asked, messages=empty))
            extra.append(measured)
            return label_scores(_first_token_alternatives(measured), choices)

        key = digest(
            [request.alias, request.messages[:-1], list(choices), request.extra], fallback=str
        )
        prior, _ = await priors.get(key, measure)
        response.label_prior = {"key": key, "scores": dict(prior)}
        for measured in extra:  # the prior's request is this call's to account for
            response.usage.prompt_tokens += measured.usage.prompt_tokens
            response.usage.completion_tokens += measured.usage.completion_tokens
    response.text = choose_label(scores, prior)
    response.label_scores = normalized(
        {c: s - prior[c] for c, s in scores.items()} if prior is not None else scores
    )
    return response


def _scoring_request(request: LLMRequest, top_k: int) -> LLMRequest:
    extra = {**request.extra, "logprobs": True, "top_logprobs": top_k}
    return replace(request, max_tokens=1, temperature=0, response_format=None, extra=extra)


def _first_token_alternatives(response: LLMResponse) -> list[dict[str, Any]]:
    tokens = response.logprobs or []
    return list(tokens[0].get("top") or []) if tokens else []


def _begins_a_label(top: Sequence[Mapping[str, Any]], scores: Mapping[str, float]) -> bool:
    """Whether some listed alternative begins a label (so ``scores`` rest on evidence,
    not on the floor `label_scores` gives a label no alternative begins)."""
    floor = min((float(a["logprob"]) for a in top if "logprob" in a), default=UNSEEN)
    return any(score >= floor for score in scores.values())
