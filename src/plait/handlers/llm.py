"""What handlers need to work with ``"llm"`` messages, in one place.

An ``"llm"`` message carries the `LLMRequest` in ``msg.kwargs["request"]`` (a
handler may rewrite it before the call: a different alias, temperature 0), the
run's `ResourceManager` in ``msg.meta["resources"]`` (where each alias leads),
and a `CallTiming` in ``msg.meta["timing"]`` (queue, rate-wait, attempt and
backoff spans, filled in by the default action).  After the call ``msg.value``
is an `LLMResponse`.  A handler answers a call itself with `answer`: the default
action is then skipped, and the engine treats the reply like any other.

Caches, recordings and checkpoints all need a key that changes exactly when the
reply could (`request_key`) and a JSON form of a reply (`response_to_json`,
`response_from_json`); they share these so a reply stored by one reads back the
same in the others.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from plait._digest import json_digest
from plait.providers.base import LLMRequest, LLMResponse, Usage
from plait.providers.scoring import remember_prior
from plait.structured import canonical_schema_json, parse_reply

if TYPE_CHECKING:
    from plait.effects import Message
    from plait.resources.config import EndpointConfig

__all__ = [
    "answer",
    "call_outcome",
    "endpoint_config",
    "request_key",
    "request_of",
    "response_from_json",
    "response_to_json",
]


def request_of(msg: Message) -> LLMRequest:
    """The request an ``"llm"`` message carries, as the handlers inside left it.

    Args:
        msg: An ``"llm"`` message.

    Returns:
        Its `LLMRequest` (``msg.kwargs["request"]``): alias, messages, temperature,
        ``max_tokens``, ``response_format`` and provider fields.
    """
    request: LLMRequest = msg.kwargs["request"]
    return request


def endpoint_config(msg: Message) -> EndpointConfig:
    """The endpoint the message's (possibly rewritten) alias leads to.

    Args:
        msg: An ``"llm"`` message of a run (its ``meta["resources"]`` is set).

    Returns:
        The alias's endpoint configuration.
    """
    return msg.meta["resources"].config_for(request_of(msg).alias)  # type: ignore[no-any-return]


def request_key(msg: Message, namespace: str = "") -> str:
    """A hash of everything that can change the reply, and nothing else.

    Provider, base URL and model (not the alias, which is only a local name), the
    messages (system prompt included), temperature, max_tokens, the response
    schema, how a label is chosen, and every extra field sent as is (tools, seed,
    stop, ...).  The built-in `cache`, `record` and checkpoints key on it.

    Args:
        msg: An ``"llm"`` message of a run.
        namespace: Mixed into the hash, to keep separate sets of keys apart.

    Returns:
        The key: 64 hexadecimal characters.
    """
    request = request_of(msg)
    config = endpoint_config(msg)
    schema = (
        canonical_schema_json(request.response_format)
        if request.response_format is not None
        else None
    )
    fields = {
        "namespace": namespace,
        "provider": config.provider,
        "base_url": config.base_url or "",
        "model": config.model,
        "messages": request.messages,
        "temperature": request.temperature,
        "max_tokens": request.max_tokens,
        "schema": schema,
        "extra": request.extra,
    }
    if request.label_method is not None:  # absent, the keys made before it existed hold
        fields["label_method"] = request.label_method
    checks = request.checks()
    if checks:  # likewise
        fields["checks"] = checks
    return json_digest(
        fields,
        default=str,
        compact=True,
        size=32,
    )


def response_to_json(response: LLMResponse) -> dict[str, Any]:
    """A reply as plain JSON data (the parsed object is rebuilt from the text on load).

    Args:
        response: The reply.

    Returns:
        Its text, usage, model, finish reason, the fallback alias that answered
        (if one did) and, for a label scored by its log-probability, each label's
        probability (and a calibrated one's prior).
    """
    stored: dict[str, Any] = {
        "text": response.text,
        "usage": [response.usage.prompt_tokens, response.usage.completion_tokens],
        "model": response.model,
        "finish_reason": response.finish_reason,
    }
    if response.label_scores is not None:  # a resumed or cached label call keeps them
        stored["label_scores"] = dict(response.label_scores)
    if response.label_prior is not None:
        stored["label_prior"] = response.label_prior
    if response.fallback is not None:  # which alias answered, for a resumed run's report
        stored["fallback"] = response.fallback
    return stored


def response_from_json(data: dict[str, Any], request: LLMRequest) -> LLMResponse:
    """The reply stored by `response_to_json`, validated again against the request's type.

    A calibrated label's prior is kept for the calls still to come on its prompt
    (`plait.providers.scoring.remember_prior`): a resumed run does not measure it again.

    Args:
        data: What `response_to_json` returned.
        request: The request it answers.

    Returns:
        The reply, its parsed object rebuilt.

    Raises:
        ValueError: When the stored text no longer matches the request's
            ``response_format``.
    """
    text = str(data["text"])
    if request.embed:  # the vectors, as the reply's text holds them
        parsed: Any = json.loads(text)
    else:
        parsed = parse_reply(request.response_format, text) if request.response_format else None
    prompt, completion = data.get("usage") or (0, 0)
    scores, prior = data.get("label_scores"), data.get("label_prior")
    if isinstance(prior, dict):  # later calls on its prompt need not measure it again
        remember_prior(prior)
    return LLMResponse(
        text,
        parsed,
        Usage(int(prompt), int(completion)),
        str(data.get("model") or ""),
        data.get("finish_reason"),
        label_scores=(
            {str(k): float(v) for k, v in scores.items()} if isinstance(scores, dict) else None
        ),
        label_prior=prior if isinstance(prior, dict) else None,
        fallback=str(data["fallback"]) if data.get("fallback") else None,
    )


def call_outcome(msg: Message, spans: list[Any]) -> str:
    """Who answered a finished call, in the word a profile or a trace shows.

    Args:
        msg: A finished call's message.
        spans: Its `CallTiming` spans.

    Returns:
        "error", "cache hit", "mocked", "replayed", "checkpoint", "answered"
        (another handler), or "ok" (the endpoint).
    """
    if msg.error is not None:
        return "error"
    if msg.meta.get("cache") == "hit":
        return "cache hit"
    if msg.meta.get("mock"):
        return "mocked"
    if msg.meta.get("replay") == "hit":
        return "replayed"
    if msg.meta.get("checkpoint") == "hit":
        return "checkpoint"
    # Every real send leaves at least a queue span, so none means a handler replied.
    if msg.type == "llm" and not spans:
        return "answered"
    return "ok"


def answer(msg: Message, response: LLMResponse) -> None:
    """Reply to ``msg`` without calling the endpoint (from a ``process_llm`` hook).

    Sets ``msg.value`` and ``msg.done``: the default action is skipped, and the reply
    goes through the rest of the handlers and the engine like a real one.

    Args:
        msg: An ``"llm"`` message.
        response: The reply.
    """
    msg.value = response
    msg.done = True
