"""The provider-neutral request and response types."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from plait._digest import digest
from plait._secrets import scrub
from plait.providers.ratelimits import parse_retry_after
from plait.structured import canonical_schema_json

if TYPE_CHECKING:
    from plait.providers.ratelimits import ReportedLimits

#: provider name -> "module:Class": the one list of wire protocols, which the resource
#: config checks names against and `plait.providers.make_provider` imports from.
PROVIDERS: dict[str, str] = {
    "openai": "plait.providers.openai:OpenAIProvider",
    "anthropic": "plait.providers.anthropic:AnthropicProvider",
    "local": "plait.providers.local:LocalProvider",
}
#: provider name -> "module:Class" of its batch API (`BatchAPI`), for the providers
#: that sell one.
BATCH_APIS: dict[str, str] = {
    "openai": "plait.providers.openai_batch:OpenAIBatchAPI",
    "anthropic": "plait.providers.anthropic_batch:AnthropicBatchAPI",
}

__all__ = [
    "BATCH_APIS",
    "PROVIDERS",
    "RETRYABLE_STATUS",
    "BatchAPI",
    "BatchStatus",
    "LLMRequest",
    "LLMResponse",
    "Provider",
    "ProviderError",
    "ReplyFormatError",
    "Usage",
    "logprobs_of",
    "status_error",
]

#: HTTP statuses worth another attempt; anything else (400, 401, 403, 404, 422) fails fast.
RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})


@dataclass(slots=True)
class LLMRequest:
    """One chat request, before it is put on any particular wire.

    Handlers may rewrite it (an override of temperature, a different alias) before
    the default action sends it.
    """

    alias: str
    messages: list[dict[str, Any]]
    temperature: float | None = None
    max_tokens: int | None = None
    response_format: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: How many leading messages are the same for every call of the call site (its
    #: system prompt and demonstrations): where a provider may mark a prompt-cache
    #: breakpoint.  Not part of the fingerprint: it changes the price, not the reply.
    prefix_messages: int = 0
    #: The call site's name for prompt-cache routing (OpenAI's ``prompt_cache_key``);
    #: not part of the fingerprint either.
    cache_key: str | None = None
    #: For a ``response_format`` of labels: how the label is chosen ("grammar",
    #: "logprob", "calibrated"; None: the provider's default), `plait.labels`.
    label_method: str | None = None
    #: An embedding request: each message's text is embedded, and the reply's
    #: ``parsed`` is their vectors, in order (`plait.embeddings`).  Only endpoints whose
    #: provider ``embeds`` take it.
    embed: bool = False

    @property
    def prompt_text(self) -> str:
        """The last user message: what error messages and logs quote."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return str(message.get("content", ""))
        return ""

    def fingerprint(self, model: str = "") -> str:
        """A stable hash of everything that changes the reply."""
        schema = (
            canonical_schema_json(self.response_format) if self.response_format is not None else ""
        )
        parts = [model, self.alias, self.messages, self.temperature, self.max_tokens, schema]
        if self.label_method is not None:  # absent, the keys made before it existed hold
            parts.append(self.label_method)
        if self.embed:  # likewise
            parts.append("embed")
        return digest([*parts, self.extra], fallback=str)


@dataclass(slots=True)
class Usage:
    """Tokens one reply used.  ``prompt_tokens`` counts the whole prompt; the cache
    counts are the parts of it read from and written to the provider's prompt cache
    (``cache_write_1h_tokens``: the writes kept an hour, a part of ``cache_write_tokens``)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class LLMResponse:
    """A reply: its text, the validated object when a schema was asked for, and usage."""

    text: str
    parsed: Any = None
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    finish_reason: str | None = None
    attempts: int = 1
    #: How the request was served: "standard", "flex" or "batch" (its price,
    #: `plait.resources.pricing`).
    tier: str = "standard"
    #: For a reply from a batch made in this process: the batch's id and when it was
    #: submitted and seen ended (`time.monotonic`), which a profile draws.
    batch: tuple[str, float, float] | None = None
    #: The generated tokens' log-probabilities, when the request asked for them
    #: (``extra={"logprobs": True, "top_logprobs": k}``): one ``{"token", "logprob",
    #: "top"}`` per token, ``top`` the k likeliest alternatives as ``{"token", "logprob"}``.
    logprobs: list[dict[str, Any]] | None = None
    #: For a label chosen by its log-probability (`plait.labels`): each label's
    #: probability, over the labels (calibrated ones when calibrating).
    label_scores: dict[str, float] | None = None
    #: The rate limits the reply's headers stated (`plait.providers.ratelimits`), which
    #: the endpoint adopts; None when it stated none.
    limits: ReportedLimits | None = None

    @property
    def payload(self) -> Any:
        return self.parsed if self.parsed is not None else self.text


def logprobs_of(choice: Any) -> list[dict[str, Any]]:
    """The token log-probabilities of one OpenAI-shaped choice (a reply's, or a streamed
    piece's), as `LLMResponse.logprobs` holds them; empty when it has none."""
    found = choice.get("logprobs") if isinstance(choice, dict) else None
    content = found.get("content") if isinstance(found, dict) else None
    if not isinstance(content, list):
        return []
    return [
        {
            "token": token.get("token"),
            "logprob": token.get("logprob"),
            "top": [
                {"token": alt.get("token"), "logprob": alt.get("logprob")}
                for alt in token.get("top_logprobs") or []
            ],
        }
        for token in content
        if isinstance(token, dict)
    ]


class ProviderError(RuntimeError):
    """An endpoint refused or failed a request; carries the HTTP status when there is one.

    The message often quotes the server (some quote the API key they were sent, in a
    401's body), and the exception itself travels far: into error values, tracebacks,
    profiles.  So it is scrubbed here, once, where it is made.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
        unavailable: bool = False,
        limits: ReportedLimits | None = None,
    ) -> None:
        super().__init__(scrub(message))
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after
        #: A 429 that says the tier asked for (OpenAI's flex) has no capacity now: worth
        #: another attempt, but not a sign this client sends too fast.
        self.unavailable = unavailable
        #: The rate limits the refusal's headers stated (a 429's say when to come back).
        self.limits = limits


class ReplyFormatError(ProviderError):
    """The endpoint answered, but not in the ``response_format`` asked for (after one
    re-ask): the model's failure, not the transport's, so it is never retried."""


def status_error(
    status: int,
    message: str,
    retry_after: str | float | None,
    code: str | None = None,
    limits: ReportedLimits | None = None,
) -> ProviderError:
    """The error for an HTTP failure, quoting the server's own message (and reading its
    error ``code``: a 429 ``resource_unavailable`` is a tier out of capacity).  With the
    reply's ``limits``, their Retry-After (``retry-after-ms``, or an HTTP date) wins."""
    delay: float | None = None
    if limits is not None and limits.retry_after_s is not None:
        delay = limits.retry_after_s
    elif limits is None and retry_after is not None:
        # Read as the limits' own Retry-After is: no infinite or NaN wait gets through.
        delay = parse_retry_after(str(retry_after))
    return ProviderError(
        f"HTTP {status}: {message}",
        status=status,
        retryable=status in RETRYABLE_STATUS,
        retry_after=delay,
        unavailable=status == 429
        and (code == "resource_unavailable" or "resource unavailable" in message.lower()),
        limits=limits,
    )


class Provider(Protocol):
    """One kind of endpoint.  ``send`` makes a single attempt.

    It raises `ProviderError` (with ``status``, ``retryable`` and ``retry_after``) for
    anything the endpoint refused or failed; for a request with ``response_format``
    it sends `plait.structured.wire_schema` in the provider's own form and returns
    the reply's JSON text unparsed (the endpoint layer validates and re-asks).
    """

    async def send(self, request: LLMRequest) -> LLMResponse: ...


@dataclass(frozen=True, slots=True)
class BatchStatus:
    """A submitted batch as its provider reports it."""

    #: Whether it will change no more (completed, expired, failed, cancelled).
    ended: bool
    #: The provider's own word for its state.
    state: str
    done: int = 0
    total: int = 0
    #: Why the whole batch failed, if it did, and whether submitting its requests again
    #: later may succeed (a queue or token limit reached, not a malformed request).
    problem: str | None = None
    problem_retryable: bool = False
    #: Where its results are (provider-specific: file ids, a URL).
    files: tuple[str, ...] = ()


class BatchAPI(Protocol):
    """One endpoint's batch API: the wire half of a batch run (`plait.resources.batching`
    keeps the queue, the ledger and the polling).  Every method makes one attempt and
    raises `ProviderError` as `Provider.send` does."""

    #: The most requests and bytes (of `line`s) one batch may hold.
    max_requests: int
    max_bytes: int

    def line(self, custom_id: str, request: LLMRequest) -> bytes:
        """``request`` as one item of a batch, named ``custom_id``: the bytes counted
        against ``max_bytes`` and handed to `submit`."""
        ...

    async def submit(self, lines: list[bytes], token: str) -> str:
        """Submit one batch of ``lines``, marked with plait's ``token`` where the
        provider can keep it; its id."""
        ...

    async def find(self, token: str, since: float, size: int) -> str | None:
        """The id of a batch of ``size`` requests submitted with ``token`` (at or after
        ``since``, epoch seconds), or None: a run killed while submitting learns
        whether it was."""
        ...

    async def status(self, batch_id: str) -> BatchStatus: ...

    def results(
        self, status: BatchStatus
    ) -> AsyncIterator[tuple[str, LLMResponse | ProviderError]]:
        """Each item's outcome, by custom id, once the batch has ended: its reply
        (``tier`` "batch"), or the error it got (``retryable`` when another batch
        may answer it: an expired item, a server error)."""
        ...

    async def cancel(self, batch_id: str) -> None: ...
