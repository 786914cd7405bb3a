"""Mixed agentic GRPO on its own (``dsv32 posttrain rl``): from an agentic GRPO recipe
(``[agentic]``, ``[[envs]]`` and the rl sections), or from the ``[tasks]`` and ``[rl]`` of the
post-training recipe, whose generated tasks are written into ``out_dir`` once the policy has loaded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from dsv32 import distributed
from dsv32.posttrain.recipe import is_posttrain_recipe, read_posttrain_recipe
from dsv32.posttrain.transfer_recipe import is_transfer_recipe
from dsv32.recipe import RecipeError, read_recipe
from dsv32.rl.agentic.config import AgenticConfig, heldout_count, load_agentic_config, work_plan
from dsv32.rl.agentic.trainer import AgenticResult, check_agentic_world, train_agentic, v32_policy
from dsv32.rl.grpo.config import RLConfigError
from dsv32.runlog import StepCheckpoints
from dsv32.trackers import require

#: How the messages of ``dsv32 posttrain rl`` begin.
COMMAND = "dsv32 posttrain rl"


class RLRecipe(NamedTuple):
    """The run's config, how many held-out tasks it evaluates, and ``write`` — what saves the post-
    training recipe's generated tasks into ``out_dir`` (None for an agentic GRPO recipe)."""

    config: AgenticConfig
    heldout: int
    write: Callable[[], None] | None


def read_rl_recipe(config: str | None, sets: list[str], keys: dict[str, Any]) -> RLRecipe:
    """The recipe ``config`` (None: the default agentic GRPO recipe) with the ``--set`` overrides
    ``sets``, then ``keys`` (agentic GRPO recipe key → value): in the post-training recipe every key
    but ``out_dir`` sets ``rl.<key>``. Nothing is written."""
    data = read_recipe(config, error=RLConfigError) if config is not None else {}
    if is_transfer_recipe(data):
        raise RecipeError(
            f"{config} is the transfer recipe: its two GRPO arms start from its own SFT stage; run it with "
            "dsv32 posttrain proof"
        )
    if config is None or not is_posttrain_recipe(data):
        cfg = load_agentic_config(config, [*sets, *(f"{k}={v}" for k, v in keys.items())])
        return RLRecipe(cfg, heldout_count(cfg), None)
    overrides = [*sets, *(f"{k if k == 'out_dir' else f'rl.{k}'}={v}" for k, v in keys.items())]
    recipe = read_posttrain_recipe(config, overrides)
    if recipe.tasks.rl_pool != "all":
        print(
            f"{COMMAND}: [tasks] rl_pool = {recipe.tasks.rl_pool!r} is a stage of the proof "
            "(after its SFT evaluation); this run draws from every training task",
            flush=True,
        )
    train, heldout = recipe.generate_tasks()
    evaluated = min(len(heldout), recipe.rl.agentic.eval_tasks)
    return RLRecipe(recipe.rl, evaluated, lambda: recipe.write_tasks(train, heldout))


def resumed_step(cfg: AgenticConfig, resume: bool) -> int:
    """The step a run resumes after (its newest checkpoint's), 0 when it starts over."""
    done = StepCheckpoints(cfg.rl.out_dir).complete() if resume else []
    return min(done[-1][0], cfg.rl.grpo.steps) if done else 0


def run_rl(run: RLRecipe, *, resume: bool = True, progress: bool = True) -> AgenticResult:
    """State the work, then train. Under ``torchrun`` every rank checks, rank 0 alone prints and
    writes the generated tasks (once the policy has loaded)."""
    cfg, heldout, write = run
    w = distributed.setup()
    check_agentic_world(cfg, w)
    require(cfg.rl.report_to)  # before the policy loads
    plan = work_plan(cfg, heldout, resumed_step(cfg, resume))
    if w.main:
        print(f"{COMMAND}: {plan}", flush=True)
    policy = None
    if write is not None:
        policy = v32_policy(cfg)
        if w.main:
            write()
        distributed.barrier()
    result = train_agentic(cfg, policy=policy, resume=resume, progress=progress)
    if w.main:
        print(result.summary())
    return result
