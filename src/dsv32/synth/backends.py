"""Backend specs: one string names a model, where it runs, its sampling and its price.

    openai:MODEL@BASE_URL[,key=value...]     any OpenAI-compatible endpoint (DeepSeek, vLLM, dsv32 serve)
    local:NAME[,key=value...]                a model loaded here (smollm2, tiny-native, a checkpoint dir)

Keys: ``temperature``, ``top_p``, ``top_k``, ``max_tokens``, ``seed`` (sampling); ``price_in``,
``price_out``, ``price_cached`` (USD per million tokens, for the cost log); ``prompt`` (an answer
agent's system prompt: a name of :data:`dsv32.synth.prompts.ANSWER_SYSTEMS`); ``max_steps``;
``thinking`` (true/false); ``key_env`` (the environment variable holding the API key, default
``OPENAI_API_KEY``; the key itself never appears in a spec, a log or provenance).

Example: ``openai:deepseek-chat@https://api.deepseek.com/v1,temperature=1.0,price_in=0.28,price_out=0.42``.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from dsv32.synth.prompts import ANSWER_SYSTEMS
from dsv32.synth.records import Pricing, SynthError
from dsv32.synth.roles import AgentSpec

SAMPLING_KEYS = {"temperature": float, "top_p": float, "top_k": int, "max_tokens": int, "seed": int}
OTHER_KEYS = {"price_in", "price_out", "price_cached", "prompt", "max_steps", "thinking", "key_env"}
_LOCAL_MODELS: dict[str, Any] = {}
_LOCAL_LOCK = threading.Lock()


@dataclass
class BackendSpec:
    kind: str
    model: str
    url: str = ""
    sampling: dict = field(default_factory=dict)
    pricing: Pricing = field(default_factory=Pricing)
    prompt: str | None = None
    max_steps: int | None = None
    thinking: bool = True
    key_env: str = "OPENAI_API_KEY"
    text: str = ""

    @property
    def label(self) -> str:
        """The generator's name in provenance: ``model@url`` or ``local:model``."""
        return f"{self.model}@{self.url}" if self.kind == "openai" else f"local:{self.model}"

    def make(self) -> Any:
        """A new backend (OpenAI: a client per call site; local: the model is loaded once per process)."""
        if self.kind == "openai":
            from dsv32.agent import OpenAIBackend

            return OpenAIBackend(self.url, self.model, api_key=os.environ.get(self.key_env))
        from dsv32.agent import LocalBackend

        with _LOCAL_LOCK:
            if self.model not in _LOCAL_MODELS:
                from dsv32.engine.models import load_model

                _LOCAL_MODELS[self.model] = load_model(self.model)
            loaded = _LOCAL_MODELS[self.model]
        return LocalBackend(loaded.model, loaded.tokenizer)

    def agent(self, name: str, default_steps: int) -> AgentSpec:
        system = None if self.prompt is None else ANSWER_SYSTEMS[self.prompt]
        return AgentSpec(name, self.make(), self.label, system, dict(self.sampling),
                         self.max_steps or default_steps, self.thinking, self.pricing,
                         retry_errors=self.kind != "local")  # fmt: skip


# What each numeric option may be: (test, in words); NaN fails every test.
_RANGES = {
    "temperature": (lambda v: 0 <= v <= 2, "a number in [0, 2]"),
    "top_p": (lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "top_k": (lambda v: v >= 0, "an integer >= 0 (0 = off)"),
    "max_tokens": (lambda v: v >= 1, "an integer >= 1"),
    "price_in": (lambda v: 0 <= v < float("inf"), "a price >= 0"),
    "price_out": (lambda v: 0 <= v < float("inf"), "a price >= 0"),
    "price_cached": (lambda v: 0 <= v < float("inf"), "a price >= 0"),
}


def _value(key: str, text: str, kind: type) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise SynthError(f"backend option {key}={text!r} must be {kind.__name__}") from None
    test, words = _RANGES.get(key, (lambda v: True, ""))
    if not test(value):
        raise SynthError(f"backend option {key}={text!r} must be {words}")
    return value


def parse_spec(text: str) -> BackendSpec:
    """Read a spec (see the module docstring); errors say what is wrong and show the form."""
    form = "openai:MODEL@BASE_URL[,key=value...] or local:NAME[,key=value...]"
    if not isinstance(text, str):
        raise SynthError(f"a backend is a string {form}, got {type(text).__name__}")
    head, *options = text.split(",")
    kind, sep, rest = head.partition(":")
    if not sep or kind not in ("openai", "local") or not rest:
        raise SynthError(f"backend {text!r}: expected {form}")
    spec = BackendSpec(kind, rest, text=text)
    if kind == "openai":
        model, at, url = rest.partition("@")
        if not at or not model or not url.startswith(("http://", "https://")):
            raise SynthError(f"backend {text!r}: an endpoint is openai:MODEL@http(s)://HOST/v1")
        spec.model, spec.url = model, url
    prices = {}
    for option in options:
        key, eq, value = option.partition("=")
        key = key.strip()
        if not eq or (key not in SAMPLING_KEYS and key not in OTHER_KEYS):
            known = ", ".join([*SAMPLING_KEYS, *sorted(OTHER_KEYS)])
            raise SynthError(
                f"backend {text!r}: unknown option {option!r}; options are key=value with key in {known}"
            )
        if key in SAMPLING_KEYS:
            spec.sampling[key] = _value(key, value, SAMPLING_KEYS[key])
        elif key.startswith("price_"):
            prices[key] = _value(key, value, float)
        elif key == "prompt":
            if value not in ANSWER_SYSTEMS:
                raise SynthError(
                    f"backend {text!r}: prompt={value!r} is not one of {', '.join(ANSWER_SYSTEMS)}"
                )
            spec.prompt = None if value == "default" else value
        elif key == "max_steps":
            spec.max_steps = _value(key, value, int)
            if spec.max_steps < 1:
                raise SynthError(f"backend {text!r}: max_steps must be >= 1")
        elif key == "thinking":
            if value not in ("true", "false"):
                raise SynthError(f"backend {text!r}: thinking must be true or false")
            spec.thinking = value == "true"
        else:
            spec.key_env = value
    spec.pricing = Pricing(
        prices.get("price_in", 0.0), prices.get("price_out", 0.0), prices.get("price_cached")
    )
    return spec
