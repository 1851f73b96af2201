"""Real models for the driver: provider adapters, each in its own module, each an optional
extra so the base client pulls no provider SDK.

* :class:`~lane.client.models.openai.OpenAIChatModel` (extra ``openai``): Chat Completions,
  which OpenAI-compatible servers speak too (give a ``base_url``);
* :class:`~lane.client.models.openai.OpenAIResponsesModel` (extra ``openai``): Responses;
* :class:`~lane.client.models.anthropic.AnthropicModel` (extra ``anthropic``): Messages.

Each converts the lane's transcript (:mod:`lane.client.models.transcript`) and the active
tools' JSON Schemas into its provider's request, streams the answer into an assistant message
(:mod:`lane.client.models.builder`) that the driver commits as it grows, and maps the
provider's errors (:mod:`lane.client.models.errors`). :func:`model_from_spec` makes one from
``PROVIDER:MODEL``, as ``lane agent --model`` takes it.
"""

from __future__ import annotations

from typing import Any

from lane.client.model import Model

__all__ = ["PROVIDERS", "model_from_spec", "parse_spec"]

#: ``PROVIDER`` of a spec → what it means.
PROVIDERS = {
    "openai": "OpenAI Chat Completions (and OpenAI-compatible servers, with a base URL)",
    "openai-responses": "OpenAI Responses",
    "anthropic": "Anthropic Messages",
}


def parse_spec(spec: str) -> tuple[str, str]:
    """``PROVIDER:MODEL`` as (provider, model); ValueError when malformed or unknown."""
    provider, colon, model = spec.partition(":")
    if not colon or not model:
        raise ValueError(f"a model is PROVIDER:MODEL (e.g. openai:gpt-5-mini), not {spec!r}")
    if provider not in PROVIDERS:
        raise ValueError(f"unknown provider {provider!r}: choose one of {', '.join(PROVIDERS)}")
    return provider, model


def model_from_spec(spec: str, **options: Any) -> Model:
    """The model of ``PROVIDER:MODEL``; ``options`` go to its adapter (``base_url``,
    ``api_key``, ``system``, ``max_tokens``, ...). Raises ValueError for a bad spec and
    ImportError, saying which extra to install, when the provider's SDK is missing."""
    provider, model = parse_spec(spec)
    extra = "anthropic" if provider == "anthropic" else "openai"
    try:
        if provider == "anthropic":
            from lane.client.models.anthropic import AnthropicModel

            return AnthropicModel(model, **options)
        from lane.client.models.openai import OpenAIChatModel, OpenAIResponsesModel

        if provider == "openai-responses":
            return OpenAIResponsesModel(model, **options)
        return OpenAIChatModel(model, **options)
    except ModuleNotFoundError as err:
        if err.name != extra:
            raise
        raise ImportError(
            f"the {extra} SDK is not installed: pip install {extra} (in a checkout of the lane "
            f"repository: pip install './clients/python[{extra}]')"
        ) from err
