"""The provider-neutral request and response types."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from plait._digest import digest
from plait._secrets import scrub
from plait.labels import DEFAULT_LOCAL_METHOD
from plait.providers.ratelimits import parse_retry_after
from plait.structured import canonical_schema_json

if TYPE_CHECKING:
    from plait.providers.ratelimits import ReportedLimits

PROVIDERS: dict[str, str] = {
    "openai": "plait.providers.openai:OpenAIProvider",
    "anthropic": "plait.providers.anthropic:AnthropicProvider",
    "local": "plait.providers.local:LocalProvider",
}
"""Provider name -> ``"module:Class"``: the one list of wire protocols.

`EndpointConfig` checks ``provider`` names against it and `make_provider` imports
from it: ``"openai"`` (every OpenAI-compatible server), ``"anthropic"`` and
``"local"`` (the embedded model)."""
LABEL_METHODS_BY_PROVIDER: dict[str, tuple[str, ...]] = {
    "openai": ("grammar", "logprob", "calibrated"),
    "anthropic": ("grammar",),
    "local": ("grammar", "logprob", "calibrated"),
}
"""Provider name -> the label methods (`plait.labels`) its endpoints can run.

Scoring a label (``"logprob"``, ``"calibrated"``) needs the reply's
log-probabilities: the embedded model and OpenAI-compatible endpoints return them
(`plait.providers.scoring`), Anthropic's API does not, so there only the
constrained reply (``"grammar"``: a tool schema with an ``enum``) runs."""
#: Provider name -> the method a label call with ``label_method=None`` runs there.
DEFAULT_LABEL_METHOD: dict[str, str] = {
    "openai": "grammar",
    "anthropic": "grammar",
    "local": DEFAULT_LOCAL_METHOD,
}
#: provider name -> "module:Class" of its batch API (`BatchAPI`), for the providers
#: that sell one.
BATCH_APIS: dict[str, str] = {
    "openai": "plait.providers.openai_batch:OpenAIBatchAPI",
    "anthropic": "plait.providers.anthropic_batch:AnthropicBatchAPI",
}

__all__ = [
    "BATCH_APIS",
    "DEFAULT_LABEL_METHOD",
    "LABEL_METHODS_BY_PROVIDER",
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
    "check_reply_checks",
    "logprobs_of",
    "reply_checks",
    "status_error",
]

#: HTTP statuses worth another attempt; anything else (400, 401, 403, 404, 422) fails fast.
RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})


@dataclass(slots=True)
class LLMRequest:
    """One chat request, before it is put on any particular wire: what handlers and mocks see.

    Every LLM call becomes one; handlers may rewrite it (an override of
    temperature, a different alias) before the default action sends it, and a
    `mock` reply function receives it.

    Args:
        alias: The resource alias it goes to.
        messages: Chat messages, ``{"role": ..., "content": ...}``, in order.
        temperature: Sampling temperature (None: the endpoint's default).
        max_tokens: Reply limit (None: the endpoint's default).
        response_format: The reply's type (a pydantic model, a ``Literal`` of
            labels...), for structured output; None for text.
        extra: Further request fields passed to the provider (``seed``,
            ``logprobs``...).
        prefix_messages: How many leading messages are the same for every call of
            the call site (its system prompt and demonstrations): where a provider
            may mark a prompt-cache breakpoint.  Not part of the fingerprint: it
            changes the price, not the reply.
        cache_key: The call site's name for prompt-cache routing (OpenAI's
            ``prompt_cache_key``); not part of the fingerprint either.
        label_method: For a ``response_format`` of labels, how the label is
            chosen (``"grammar"``, ``"logprob"``, ``"calibrated"``; None: the
            provider's default).
        embed: An embedding request: each message's text is embedded, and the
            reply's ``parsed`` is their vectors, in order.  Only endpoints whose
            provider embeds take it.
        validate: Checks each reply's payload (the parsed object, or the text):
            raising ``ValueError`` or ``AssertionError`` (a pydantic validation
            error is a ``ValueError``), or returning False, rejects it, and the error is
            sent back for another answer (see ``max_reasks``).
        max_reasks: How many times a reply that does not parse into the
            ``response_format`` or that ``validate`` rejects is sent back with its
            error for another answer.
        max_tokens_per_call: The most tokens (prompt and reply) all of the call's
            attempts may spend together; None: no bound.

    Examples:
        >>> from plait.providers import LLMRequest
        >>> request = LLMRequest(
        ...     "fast",
        ...     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        ... )
        >>> request.prompt_text
        'Hi'
    """

    alias: str
    messages: list[dict[str, Any]]
    temperature: float | None = None
    max_tokens: int | None = None
    response_format: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    prefix_messages: int = 0
    cache_key: str | None = None
    label_method: str | None = None
    embed: bool = False
    validate: Callable[[Any], Any] | None = None
    max_reasks: int = 1
    max_tokens_per_call: int | None = None

    @property
    def prompt_text(self) -> str:
        """The last user message: what error messages and logs quote."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return str(message.get("content", ""))
        return ""

    def fingerprint(self, model: str = "") -> str:
        """A stable hash of everything that changes the reply: what caches and checkpoints key on.

        Args:
            model: The model that will answer, part of what changes the reply.

        Returns:
            A hex digest, the same in every process and run.
        """
        schema = (
            canonical_schema_json(self.response_format) if self.response_format is not None else ""
        )
        parts = [model, self.alias, self.messages, self.temperature, self.max_tokens, schema]
        if self.label_method is not None:  # absent, the keys made before it existed hold
            parts.append(self.label_method)
        if self.embed:  # likewise
            parts.append("embed")
        parts.extend(self.checks())
        return digest([*parts, self.extra], fallback=str)

    def checks(self) -> list[Any]:
        """What the reply must pass that changes which reply is kept.

        Returns:
            `reply_checks` of the request's validator and re-ask bounds.
        """
        return reply_checks(self.validate, self.max_reasks, self.max_tokens_per_call)


def check_reply_checks(
    validate: Any, max_reasks: Any, max_tokens_per_call: Any, where: str
) -> None:
    """Refuse reply checks that can never work, naming the argument and the fix.

    Args:
        validate: A validator: a function of the reply, or None.
        max_reasks: Re-asks after a rejected reply: an integer >= 0.
        max_tokens_per_call: A bound on the tokens of a call's attempts together: a
            positive integer, or None.
        where: The call that took them, as the messages name it (``"LLMInference"``).

    Raises:
        TypeError: When ``validate`` is not callable.
        ValueError: When a bound is not an integer in its range.
    """
    if validate is not None and not callable(validate):
        raise TypeError(
            f"{where}(validate=...) takes a function of the reply (raise ValueError "
            f"or AssertionError, or return False, to reject it), got {type(validate).__name__}"
        )
    if isinstance(max_reasks, bool) or not isinstance(max_reasks, int) or max_reasks < 0:
        raise ValueError(
            f"{where}(max_reasks=...) is how many times a rejected reply is sent back "
            f"for another answer, an integer >= 0; got {max_reasks!r}"
        )
    if max_tokens_per_call is not None and (
        isinstance(max_tokens_per_call, bool)
        or not isinstance(max_tokens_per_call, int)
        or max_tokens_per_call < 1
    ):
        raise ValueError(
            f"{where}(max_tokens_per_call=...) bounds the tokens of a call's attempts "
            f"together, a positive integer or None; got {max_tokens_per_call!r}"
        )


def reply_checks(
    validate: Callable[[Any], Any] | None, max_reasks: int, max_tokens_per_call: int | None
) -> list[Any]:
    """A call's reply checks as keys and versions name them: the validator's name and
    the bounds on re-asking, each only when set (keys made before they existed hold).

    Args:
        validate: The call's validator, if any.
        max_reasks: Its re-asks (1 is the default, and left out).
        max_tokens_per_call: Its bound on the tokens of all its attempts, if any.

    Returns:
        The parts that are set, as text.
    """
    found: list[Any] = []
    if validate is not None:
        module = getattr(validate, "__module__", None) or type(validate).__module__
        name = getattr(validate, "__qualname__", None) or type(validate).__qualname__
        found.append(f"validate={module}.{name}")
    if max_reasks != 1:
        found.append(f"max_reasks={max_reasks}")
    if max_tokens_per_call is not None:
        found.append(f"max_tokens_per_call={max_tokens_per_call}")
    return found


@dataclass(slots=True)
class Usage:
    """Tokens one reply used, for the usage report, budgets and prices.

    Args:
        prompt_tokens: The whole prompt.
        completion_tokens: The reply.
        cache_read_tokens: The part of the prompt read from the provider's prompt cache.
        cache_write_tokens: The part of the prompt written to it.
        cache_write_1h_tokens: The writes kept an hour, a part of ``cache_write_tokens``.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Prompt and completion tokens together."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class LLMResponse:
    """A reply: its text, the validated object when a schema was asked for, and usage.

    What an endpoint returns for an `LLMRequest`, and what a `mock` reply function
    may return whole (to set usage or a finish reason).

    Args:
        text: The reply's text.
        parsed: The validated object, for a request with a ``response_format``.
        usage: The tokens it used.
        model: The model that answered.
        finish_reason: Why generation stopped (``"stop"``, ``"length"``...).
        attempts: How many attempts it took.
        tier: How it was served, and so priced: ``"standard"``, ``"flex"`` or ``"batch"``.
        batch: For a reply from a batch made in this process: the batch's id and
            when it was submitted and seen ended (``time.monotonic``), which a
            profile draws.
        logprobs: The generated tokens' log-probabilities, when the request asked
            for them (``extra={"logprobs": True, "top_logprobs": k}``): one
            ``{"token", "logprob", "top"}`` per token.
        label_scores: For a label chosen by its log-probability: each label's
            probability.
        label_prior: For a ``"calibrated"`` label: the content-free prior it was
            divided by, ``{"key": ..., "scores": {...}}`` (the key a digest of
            the prompt it was measured on), so a stored reply spares a resumed
            run measuring it again.
        limits: The rate limits the reply's headers stated, which the endpoint
            adopts; None when it stated none.
        fallback: The alias that answered when the call's own alias could not and
            one of its ``fallbacks`` did (None: the call's own alias answered).
    """

    text: str
    parsed: Any = None
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    finish_reason: str | None = None
    attempts: int = 1
    tier: str = "standard"
    batch: tuple[str, float, float] | None = None
    logprobs: list[dict[str, Any]] | None = None
    label_scores: dict[str, float] | None = None
    label_prior: dict[str, Any] | None = None
    limits: ReportedLimits | None = None
    fallback: str | None = None

    @property
    def payload(self) -> Any:
        """What the call returns to the pipeline: the parsed object if any, else the text."""
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

    A call that fails with it becomes that input's error `Value` (its message names
    the alias and the cause).  The message often quotes the server (some quote the
    API key they were sent, in a 401's body), and the exception itself travels far:
    into error values, tracebacks, profiles.  So it is scrubbed of credentials
    here, once, where it is made.

    Args:
        message: What went wrong, quoting the server where it said.
        status: The HTTP status, if there was a reply.
        retryable: Whether another attempt may succeed (a 429, a 5xx, a timeout).
        retry_after: The seconds the server asked to wait before the next attempt.
        unavailable: A 429 that says the tier asked for (OpenAI's flex) has no
            capacity now: worth another attempt, but not a sign this client sends
            too fast.
        limits: The rate limits the refusal's headers stated.
        transport: For a request that got no reply: ``"timeout"`` (it ran over the
            alias's ``timeout``) or ``"connection"`` (refused or dropped).
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
        transport: str | None = None,
    ) -> None:
        super().__init__(scrub(message))
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after
        self.unavailable = unavailable
        self.limits = limits
        self.transport = transport


class ReplyFormatError(ProviderError):
    """The endpoint answered, but not in the ``response_format`` asked for, or its
    ``validate`` rejected every answer (after the request's re-asks): the model's
    failure, not the transport's, so it is never retried."""


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
    """One kind of endpoint (a wire protocol); retries, limits and validation live above it.

    A provider makes a single attempt per `send`, so that retries, rate limits,
    usage accounting and structured-output validation are the same for every
    provider (`Endpoint` does them).  `make_provider` builds one from an
    `EndpointConfig`.
    """

    async def send(self, request: LLMRequest) -> LLMResponse:
        """Send ``request`` once.

        For a request with a ``response_format`` it sends the schema in the
        provider's own form and returns the reply's JSON text unparsed (the
        endpoint validates it and re-asks).

        Args:
            request: The request.

        Returns:
            The reply, with its usage.

        Raises:
            ProviderError: The endpoint refused or failed the request (with
                ``status``, ``retryable`` and ``retry_after``).
        """
        ...


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
