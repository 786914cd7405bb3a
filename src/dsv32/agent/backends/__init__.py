"""Backends: where the model runs. :class:`ScriptedBackend` (given replies), :class:`OpenAIBackend`
(any OpenAI-compatible endpoint) and :class:`LocalBackend` (a model loaded here, via dsv32.engine)."""

from dsv32.agent.backends.base import Backend, Completion, TokenEstimator, Usage
from dsv32.agent.backends.local import LocalBackend
from dsv32.agent.backends.openai_api import OpenAIBackend
from dsv32.agent.backends.scripted import ScriptedBackend

__all__ = [
    "Backend",
    "Completion",
    "LocalBackend",
    "OpenAIBackend",
    "ScriptedBackend",
    "TokenEstimator",
    "Usage",
]
