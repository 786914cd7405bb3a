"""Rewards per domain (paper §3, mixed RL): ``R = Σ_c weight_c · component_c(sample)``.

Reasoning and agent domains get a rule-based outcome reward, a length penalty and a language-
consistency reward; general (alignment) domains get the generative reward model with the prompt's
rubric. One :class:`RewardSpec` per domain says which components with which weights::

    reward = compose_rewards(default_reward_specs(max_tokens=4096), grm=grm)
    result = reward({"domain": "math", "prompt": q, "completion": text, "num_completion_tokens": 812,
                     "answer": "3/4"})
    result.total, result.components, result.correct     # 1.2, {"math": 1.0, "format": 1.0, ...}, True
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dsv32.recipe import NON_NEGATIVE, POSITIVE, Checked, Rule, at_least, check_fields, one_of
from dsv32.rl.grpo.rewards.judge import GenerativeRewardModel, Judgement, RewardModelError
from dsv32.rl.grpo.rewards.outcome import answer_part, exact_match_reward, format_reward, math_reward
from dsv32.rl.grpo.rewards.shaping import LENGTH_SHAPES, language_consistency, length_penalty

COMPONENTS: dict[str, str] = {
    "math": "1 if the last \\boxed{} of the answer equals the sample's answer (math-verify), else 0",
    "exact": "1 if the final answer equals the sample's answer after normalisation, else 0",
    "format": "1 if the completion has the expected shape (closed thinking, one \\boxed{}), else 0",
    "length": "length penalty in [-1, 0] (overlong/none) or -n/max_tokens (linear)",
    "language": "share of the completion's letters in the prompt's script, in [0, 1]",
    "grm": "generative reward model's score / scale with the sample's rubric, in [0, 1]",
}
OUTCOME_COMPONENTS = ("math", "exact")  # the first present decides RewardResult.correct


@dataclass(frozen=True)
class RewardSpec(Checked):
    """How one domain is scored. ``weights`` maps component names (:data:`COMPONENTS`) to weights.

    ``max_tokens`` is the generation budget L_max (required with ``"length"``), ``length_shape`` and
    ``cache_tokens`` as in :func:`~dsv32.rl.grpo.rewards.shaping.length_penalty`. ``thinking``: completions
    read ``reasoning</think>answer``; the outcome and the judge see the answer only, and ``format``
    requires the closed reasoning. ``require_boxed``: ``format`` requires one ``\\boxed{}``.
    ``rubric_key``: the sample field holding the judge's rubric (the judge's default rubric if a mapping
    sample leaves it out); an RL task's rubric is always its ``rubric`` field.
    ``math_timeout_seconds``: bound on each math-verify check (None: unbounded).
    """

    RANGES: ClassVar[dict[str, Rule]] = {
        "max_tokens": at_least(1),
        "length_shape": one_of(*LENGTH_SHAPES),
        "cache_tokens": NON_NEGATIVE,
        "rubric_key": Rule(bool, "a non-empty field name"),
        "math_timeout_seconds": POSITIVE,
    }

    weights: Mapping[str, float]
    max_tokens: int | None = None
    length_shape: str = "overlong"
    cache_tokens: int | None = None
    thinking: bool = False
    require_boxed: bool = True
    rubric_key: str = "rubric"
    math_timeout_seconds: float | None = 5

    def __post_init__(self) -> None:
        options = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "weights"}
        check_fields(type(self), options, "RewardSpec")  # types and RANGES, as for a recipe section
        super().__post_init__()
        if not isinstance(self.weights, Mapping) or not self.weights:
            raise ValueError(
                f"a RewardSpec needs at least one weighted component; known: {sorted(COMPONENTS)}"
            )
        unknown = sorted(set(self.weights) - set(COMPONENTS))
        if unknown:
            raise ValueError(f"unknown reward components {unknown}; known: {sorted(COMPONENTS)}")
        for name, weight in self.weights.items():
            if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
                raise ValueError(f"weight of {name!r} must be a finite number, got {weight!r}")
        if "length" in self.weights:
            if self.max_tokens is None:
                raise ValueError("the 'length' component needs max_tokens (the generation budget)")
            length_penalty(
                0, max_tokens=self.max_tokens, shape=self.length_shape, cache_tokens=self.cache_tokens
            )
        object.__setattr__(self, "weights", dict(self.weights))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "RewardSpec") -> RewardSpec:
        """From a TOML table: ``[rewards.math] weights = {math = 1.0, format = 0.1}``, ``max_tokens = …``;
        a key, type or range problem raises :class:`~dsv32.recipe.RecipeError` naming ``where``."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown RewardSpec keys {unknown}; known: {sorted(known)}")
        if "weights" not in data:
            raise ValueError(
                f"a reward spec needs weights = {{component = weight}}; components: {sorted(COMPONENTS)}"
            )
        options = check_fields(cls, {k: v for k, v in data.items() if k != "weights"}, where)
        return cls(weights=data["weights"], **options)


def default_reward_specs(
    *, max_tokens: int, thinking: bool = False, cache_tokens: int | None = None
) -> dict[str, RewardSpec]:
    """Defaults for the three built-in domains (``max_tokens``: the rollout's generation budget):

    - ``"math"``: math outcome 1.0 + format 0.1 + DAPO overlong penalty 1.0 + language 0.1;
    - ``"exact"``: exact-match outcome 1.0 + overlong penalty 1.0 + language 0.1;
    - ``"general"``: generative RM with the prompt's rubric 1.0 + language 0.1.
    """
    length = {"max_tokens": max_tokens, "length_shape": "overlong", "cache_tokens": cache_tokens}
    return {
        "math": RewardSpec(
            {"math": 1.0, "format": 0.1, "length": 1.0, "language": 0.1}, thinking=thinking, **length
        ),
        "exact": RewardSpec({"exact": 1.0, "length": 1.0, "language": 0.1}, thinking=thinking, **length),
        "general": RewardSpec({"grm": 1.0, "language": 0.1}, thinking=thinking),
    }


@dataclass
class RewardSample:
    """What a reward needs about one rollout (any mapping or object with these fields will do)."""

    domain: str
    prompt: str
    completion: str
    num_completion_tokens: int = 0
    answer: str | None = None
    rubric: str | None = None


@dataclass(frozen=True)
class RewardResult:
    """``total`` = Σ weight · component; ``components`` unweighted; ``correct`` whether the outcome
    reward (math or exact) was 1 — None for domains without one; ``scored`` False when a component
    could not be computed (the judge's request failed): the sample has no reward to learn from."""

    total: float
    components: dict[str, float] = field(default_factory=dict)
    correct: bool | None = None
    scored: bool = True


_MISSING = object()


def _get(sample: Any, name: str, default: Any = _MISSING) -> Any:
    value = sample.get(name, default) if isinstance(sample, Mapping) else getattr(sample, name, default)
    if value is _MISSING:
        raise ValueError(f"the reward sample has no {name!r} field (sample type {type(sample).__name__})")
    return value


class RewardFunction:
    """``reward(sample) -> RewardResult`` with one :class:`RewardSpec` per domain. ``grm`` is needed
    when any spec weights ``"grm"``."""

    def __init__(self, specs: Mapping[str, RewardSpec], grm: GenerativeRewardModel | None = None) -> None:
        if not specs:
            raise ValueError("compose_rewards needs at least one domain spec")
        for domain, spec in specs.items():
            if not isinstance(spec, RewardSpec):
                raise TypeError(f"spec of domain {domain!r} must be a RewardSpec, got {type(spec).__name__}")
            if "grm" in spec.weights and grm is None:
                raise RewardModelError(
                    f"domain {domain!r} weights 'grm' but no GenerativeRewardModel was given: "
                    "pass grm=, or leave the domain out of the specs"
                )
        self.specs = dict(specs)
        self.grm = grm

    @property
    def domains(self) -> list[str]:
        return sorted(self.specs)

    def __call__(self, sample: Any) -> RewardResult:
        domain = _get(sample, "domain")
        spec = self.specs.get(domain)
        if spec is None:
            raise ValueError(f"no reward for domain {domain!r}; known domains: {self.domains}")
        components, scored = {}, True
        for name in spec.weights:
            if name == "grm":
                judgement = self._judge(spec, sample)
                components[name], scored = judgement.reward, scored and judgement.scored
            else:
                components[name] = self._component(name, spec, sample)
        total = sum(spec.weights[name] * value for name, value in components.items())
        outcome = next((name for name in OUTCOME_COMPONENTS if name in components), None)
        correct = None if outcome is None else components[outcome] == 1.0
        return RewardResult(total=total, components=components, correct=correct, scored=scored)

    def score_many(self, samples: Sequence[Any], *, max_workers: int = 1) -> list[RewardResult]:
        """Rewards of ``samples`` in order; ``max_workers > 1`` overlaps judge requests (and math checks,
        which then run in worker processes, see :mod:`dsv32.envs.mathcheck`)."""
        if max_workers <= 1:
            return [self(s) for s in samples]
        with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="reward") as pool:
            return list(pool.map(self, samples))

    def _component(self, name: str, spec: RewardSpec, sample: Any) -> float:
        completion = _get(sample, "completion")
        if name == "format":
            return format_reward(completion, require_boxed=spec.require_boxed, thinking=spec.thinking)
        if name == "length":
            n = _get(sample, "num_completion_tokens")
            return length_penalty(
                n, max_tokens=spec.max_tokens, shape=spec.length_shape, cache_tokens=spec.cache_tokens
            )
        if name == "language":
            return language_consistency(_get(sample, "prompt"), completion)
        answer_text = answer_part(completion, thinking=spec.thinking)
        reference = _get(sample, "answer", None)
        if reference is None:
            raise ValueError(f"the {name!r} reward needs the sample's reference 'answer', which is missing")
        if name == "math":
            return math_reward(answer_text, reference, timeout_seconds=spec.math_timeout_seconds)
        accepted = reference if isinstance(reference, str | list | tuple) else str(reference)
        return exact_match_reward(answer_text, accepted)

    def _judge(self, spec: RewardSpec, sample: Any) -> Judgement:
        answer_text = answer_part(_get(sample, "completion"), thinking=spec.thinking)
        if not isinstance(sample, Mapping) and not hasattr(sample, spec.rubric_key):
            raise ValueError(  # a mapping may leave its rubric out; an object's fields are fixed
                f"rubric_key = {spec.rubric_key!r}: the reward sample ({type(sample).__name__}) has no "
                "such field"
            )
        rubric = _get(sample, spec.rubric_key, None)
        return self.grm.evaluate(_get(sample, "prompt"), answer_text, rubric)


def compose_rewards(
    specs: Mapping[str, RewardSpec], grm: GenerativeRewardModel | None = None
) -> RewardFunction:
    """The reward function of a mixed RL stage: ``reward(sample) -> RewardResult`` per domain."""
    return RewardFunction(specs, grm)
