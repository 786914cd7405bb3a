"""The recipe of agentic GRPO: an RL recipe (:mod:`dsv32.rl.grpo.config`) plus ``[agentic]`` (how episodes
run and are rewarded) and ``[[envs]]`` (the environments in the mix, with weights and domains).

    [agentic]                     # episodes
    prompt = "env"                # env | bare | reasoning_agent | agent (see dsv32.rl.agentic.episodes)
    max_steps = 4                 # model calls per episode
    context = "none"              # or summary | discard_75 | discard_all (with context_window)
    length_weight = 0.0           # R = verifier + w_len · length penalty + w_lang · language
    format_weight = 0.0           #     + w_fmt · well-formed tool use (1 or 0)
    single_turn = false           # also draw the [[sources]] (single-turn domains) into the mix

    [[envs]]
    name = "code-interpreter"
    tasks = "train"               # a task set of the environment or a JSONL file
    eval_tasks = "heldout"        # held-out tasks for greedy evaluation ("" = none)
    weight = 1.0                  # share of the step's prompts
    domain = ""                   # KL strength key (grpo.domain_kl_coef); default: the env name
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from dsv32.chat.templates import EPISODE_PROMPTS
from dsv32.envs.base import EnvError, get_env
from dsv32.recipe import NON_NEGATIVE, POSITIVE, Checked, Rule, at_least, build_section, one_of, read_recipe
from dsv32.rl.grpo.config import RLConfig, RLConfigError, rl_config_from_dict
from dsv32.rl.grpo.rewards.shaping import LENGTH_SHAPES


@dataclass
class AgenticSection(Checked, error=RLConfigError):
    RANGES: ClassVar[dict[str, Rule]] = {
        "prompt": one_of(*EPISODE_PROMPTS),
        "max_steps": at_least(1),
        "context": one_of("none", "summary", "discard_75", "discard_all"),
        "context_window": NON_NEGATIVE,
        "tool_timeout_s": POSITIVE,
        "length_weight": NON_NEGATIVE,
        "length_shape": one_of(*LENGTH_SHAPES),
        "language_weight": NON_NEGATIVE,
        "format_weight": NON_NEGATIVE,
        "eval_tasks": NON_NEGATIVE,
    }

    prompt: str = "env"
    max_steps: int = 4
    thinking: bool = True
    context: str = "none"
    context_window: int = 0
    tool_timeout_s: float = 30.0
    length_weight: float = 0.0
    length_shape: str = "overlong"
    language_weight: float = 0.0
    format_weight: float = 0.0
    single_turn: bool = False
    eval_tasks: int = 40

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.context != "none" and not self.context_window:
            raise RLConfigError(f"[agentic] context = {self.context!r} needs context_window (tokens)")


@dataclass
class EnvSource(Checked, error=RLConfigError):
    RANGES: ClassVar[dict[str, Rule]] = {"weight": POSITIVE, "name": Rule(bool, "an environment name")}

    name: str = "code-interpreter"
    tasks: str = "train"
    eval_tasks: str = "heldout"
    weight: float = 1.0
    domain: str = ""
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.domain or self.name


@dataclass
class AgenticConfig:
    rl: RLConfig
    agentic: AgenticSection = field(default_factory=AgenticSection)
    envs: list[EnvSource] = field(default_factory=lambda: [EnvSource()])

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.rl.to_dict(),
            "agentic": dataclasses.asdict(self.agentic),
            "envs": [dataclasses.asdict(e) for e in self.envs],
        }


def agentic_config_from_dict(data: dict[str, Any], where: str = "") -> AgenticConfig:
    """Nested dicts (TOML) → :class:`AgenticConfig`; ``where``: the table that holds the recipe when
    another recipe embeds it (``rl`` of the post-training recipe), for the messages."""
    data = dict(data)
    agentic = data.pop("agentic", {})
    envs = data.pop("envs", [dataclasses.asdict(EnvSource())])
    rl = rl_config_from_dict(data, extra=("agentic", "envs"), where=where)
    section = build_section(AgenticSection, agentic, "agentic", RLConfigError)
    if not isinstance(envs, list) or not envs:
        raise RLConfigError("envs must be a non-empty array of tables ([[envs]])")
    sources = [build_section(EnvSource, e, f"envs.{i}", RLConfigError) for i, e in enumerate(envs)]
    for i, e in enumerate(sources):
        check_env_options(e, f"envs.{i}")
    return AgenticConfig(rl, section, sources)


def check_env_options(source: EnvSource, where: str) -> None:
    """``source.name`` is a registered environment and its factory takes ``source.options`` (checked
    against the factory's signature: nothing is built)."""
    try:
        factory = get_env(source.name).factory
    except EnvError as err:
        raise RLConfigError(f"[{where}] name = {source.name!r}: {err}") from None
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a callable without a readable signature is taken on trust
        return
    try:
        signature.bind(**source.options)
    except TypeError as err:
        known = sorted(
            name
            for name, p in signature.parameters.items()
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        )
        raise RLConfigError(
            f"[{where}] options = {json.dumps(source.options)}: environment {source.name!r} does not take "
            f"them ({err}); its options: {known}"
        ) from None


def load_agentic_config(path: str | Path | None = None, overrides: list[str] | None = None) -> AgenticConfig:
    """A TOML recipe (defaults when ``path`` is None) with ``section.field=value`` overrides."""
    return agentic_config_from_dict(read_recipe(path, overrides, error=RLConfigError))


def heldout_count(cfg: AgenticConfig) -> int:
    """How many held-out tasks a run evaluates on (``agentic.eval_tasks`` per environment that names
    ``eval_tasks``); reads the task sets, loads no model."""
    from dsv32.envs.base import resolve_tasks

    n = cfg.agentic.eval_tasks
    return sum(len(resolve_tasks(e.name, e.eval_tasks)[:n]) for e in cfg.envs if e.eval_tasks and n)


def work_plan(cfg: AgenticConfig, heldout: int, first_step: int = 0) -> str:
    """What a run will do, said before it starts: sampled episodes, held-out greedy episodes and an
    upper bound on the tokens each generates (every episode at ``agentic.max_steps`` model calls of
    ``sampling.max_new_tokens``). Counts, not a time: the time depends on the machine and on how long
    the replies turn out to be."""
    g, a, s = cfg.rl.grpo, cfg.agentic, cfg.rl.sampling
    steps = g.steps - first_step
    per_step = g.prompts_per_step * g.group_size
    per_episode = a.max_steps * s.max_new_tokens
    every = cfg.rl.eval.every
    mid = [k for k in range(every, g.steps, every) if k > first_step] if every else []
    evals = (0 if first_step else 1) + len(mid) + 1  # before (a fresh run), every `every` steps, after
    resumed = f" (resuming after step {first_step} of {g.steps})" if first_step else ""
    lines = [
        f"plan: {steps} step(s){resumed} × {per_step} sampled episodes ({g.prompts_per_step} prompts "
        f"× group of {g.group_size}) = {steps * per_step} episodes, {g.mini_batches} update(s) per step; "
        f"each episode at most {a.max_steps} model calls × {s.max_new_tokens} new tokens, so at most "
        f"{steps * per_step * per_episode:,} sampled tokens",
    ]
    if a.single_turn:
        lines.append("(the mix also draws single-turn [[sources]]: some episodes are single-turn samples)")
    if heldout:
        lines.append(
            f"held-out evaluation: {heldout} tasks × {evals} evaluations = {heldout * evals} greedy "
            f"episodes, at most {heldout * evals * per_episode:,} tokens"
        )
    else:
        lines.append("held-out evaluation: none (agentic.eval_tasks = 0 or no eval_tasks)")
    lines.append("(upper bounds; the time is not estimated: it depends on the machine and on reply lengths)")
    return "\n".join(lines)
