"""Where the examples send their LLM calls: the embedded model, or an endpoint you name.

By default `resources_for` returns None.  With no resources configured anywhere,
plait resolves every alias to its embedded local model (SmolLM2-135M-Instruct,
run in-process), so every example runs with no key and no server.

Set ``PLAIT_EXAMPLES_BASE_URL`` to send the calls to any OpenAI-compatible
endpoint instead (OpenAI, vLLM, SGLang, Ollama, ...)::

    export PLAIT_EXAMPLES_BASE_URL=https://api.openai.com/v1
    export PLAIT_EXAMPLES_API_KEY=sk-...          # optional: local servers may not need one
    export PLAIT_EXAMPLES_MODEL=gpt-4o-mini       # optional: this is the default
    python examples/fan_in.py

Every alias the pipeline uses then maps to that one endpoint.  Real code names
each alias in a `plait.ResourceConfig` (or a resources.toml) instead; this helper
exists only so that each example stays about its pattern, not its configuration.
"""

from __future__ import annotations

import os

import plait

__all__ = ["API_KEY_ENV", "BASE_URL_ENV", "MODEL_ENV", "resources_for"]

BASE_URL_ENV = "PLAIT_EXAMPLES_BASE_URL"
API_KEY_ENV = "PLAIT_EXAMPLES_API_KEY"
MODEL_ENV = "PLAIT_EXAMPLES_MODEL"
DEFAULT_MODEL = "gpt-4o-mini"


def resources_for(pipeline: plait.Module) -> plait.ResourceConfig | None:
    """Resources covering every alias in ``pipeline``, or None for the embedded model."""
    base_url = os.environ.get(BASE_URL_ENV)
    if not base_url:
        return None
    endpoint: dict[str, str] = {
        "provider": "openai",
        "model": os.environ.get(MODEL_ENV) or DEFAULT_MODEL,
        "base_url": base_url,
    }
    if os.environ.get(API_KEY_ENV):
        # A reference, not the key itself: it never lands in a repr or a log.
        endpoint["api_key_env"] = API_KEY_ENV
    aliases = {m.alias for m in pipeline.modules() if isinstance(m, plait.LLMInference)}
    return plait.ResourceConfig({alias: dict(endpoint) for alias in sorted(aliases)})
