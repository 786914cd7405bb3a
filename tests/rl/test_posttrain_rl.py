"""``dsv32 posttrain rl`` on the shipped post-training recipe: its ``[tasks]`` and ``[rl]`` are read
(flags set ``rl.*``), the work is stated before anything runs, and a run trains on the generated
tasks and evaluates on the held-out ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import dsv32
from dsv32.cli import build_parser, main
from dsv32.cli.posttrain import rl_recipe
from dsv32.rl.agentic.config import work_plan
from dsv32.runlog import read_metrics

SHIPPED = Path(dsv32.__file__).parent / "configs" / "posttrain-smollm2.toml"


def _args(*argv: str):
    return build_parser().parse_args(["posttrain", "rl", *argv])


def test_the_shipped_recipe_is_read_with_the_sections_the_proof_uses(tmp_path):
    cfg, heldout, write = rl_recipe(_args(str(SHIPPED), "--steps", "1", "--out", str(tmp_path / "p")))
    assert cfg.rl.grpo.steps == 1 and cfg.rl.grpo.group_size == 4 and cfg.rl.sampling.max_new_tokens == 96
    assert cfg.rl.out_dir == str(tmp_path / "p" / "rl")
    assert cfg.rl.policy.name == str(tmp_path / "p" / "sft" / "model")  # the proof's SFT output
    assert cfg.agentic.prompt == "bare" and cfg.agentic.max_steps == 3
    (env,) = cfg.envs
    assert env.tasks == str(tmp_path / "p" / "tasks_train.jsonl")
    assert env.eval_tasks == str(tmp_path / "p" / "tasks_heldout.jsonl")
    assert heldout == 0  # the recipe's agentic.eval_tasks = 0
    assert not (tmp_path / "p").exists()  # reading writes nothing
    write()
    assert len((tmp_path / "p" / "tasks_train.jsonl").read_text().splitlines()) == 32


def test_the_quick_flags_set_the_recipes_rl_sections(tmp_path):
    argv = [
        str(SHIPPED),
        "--policy",
        "m",
        "--prompts-per-step",
        "1",
        "--group-size",
        "2",
        "--eval-tasks",
        "3",
    ]
    cfg, heldout, _ = rl_recipe(_args(*argv, "--out", str(tmp_path)))
    assert (cfg.rl.policy.name, cfg.rl.grpo.prompts_per_step, cfg.rl.grpo.group_size) == ("m", 1, 2)
    assert cfg.agentic.eval_tasks == 3 and heldout == 3
    cfg, heldout, write = rl_recipe(_args("--group-size", "2", "--eval-tasks", "3", "--out", str(tmp_path)))
    assert cfg.rl.grpo.group_size == 2 and heldout == 3 and write is None  # an agentic recipe of its own


def test_the_plan_counts_episodes_evaluations_and_token_bounds(tmp_path):
    cfg, _, _ = rl_recipe(_args(str(SHIPPED), "--steps", "4", "--out", str(tmp_path)))
    plan = work_plan(cfg, heldout=24)
    assert "4 step(s) × 8 sampled episodes (2 prompts × group of 4) = 32 episodes" in plan
    assert f"at most {32 * 3 * 96:,} sampled tokens" in plan
    assert f"24 tasks × 2 evaluations = 48 greedy episodes, at most {48 * 3 * 96:,} tokens" in plan
    resumed = work_plan(cfg, heldout=24, first_step=3)
    assert "1 step(s) (resuming after step 3 of 4)" in resumed and "24 tasks × 1 evaluations" in resumed
    assert "held-out evaluation: none" in work_plan(cfg, heldout=0)


def _v32_policy(model: str, path: Path) -> str:
    from dsv32.train.sft.model import prepare_sft_model, save_sft_model

    return str(save_sft_model(prepare_sft_model(model, "cpu"), path))


def test_posttrain_rl_runs_the_shipped_recipe_and_says_its_work_first(tmp_path, capsys):
    policy = _v32_policy("tiny-llama", tmp_path / "policy")
    argv = ["posttrain", "rl", str(SHIPPED), "--policy", policy, "--steps", "1", "--prompts-per-step", "1",
            "--group-size", "2", "--eval-tasks", "1", "--set", "rl.sampling.max_new_tokens=8",
            "--out", str(tmp_path / "p"), "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("dsv32 posttrain rl: plan: 1 step(s) × 2 sampled episodes")
    assert "1 tasks × 2 evaluations = 2 greedy episodes" in out
    assert "dsv32 posttrain rl: 1 steps" in out
    (row,) = read_metrics(tmp_path / "p" / "rl" / "metrics.jsonl")
    assert row["step"] == 1 and row["reward_by_domain"].keys() == {"code-interpreter"}
    evals = read_metrics(tmp_path / "p" / "rl" / "eval.jsonl")
    assert [e["episodes"] for e in evals] == [1, 1]
    config = json.loads((tmp_path / "p" / "rl" / "config.json").read_text())
    assert config["agentic"]["prompt"] == "bare" and config["policy"]["name"] == policy


@pytest.mark.slow
def test_posttrain_rl_runs_the_shipped_recipe_on_smollm2(tmp_path, capsys):
    """The quick form of docs/posttrain.md on the real model (with the V3.2 tokens added)."""
    policy = _v32_policy("smollm2", tmp_path / "policy")
    argv = ["posttrain", "rl", str(SHIPPED), "--policy", policy, "--steps", "1", "--out", str(tmp_path / "p"),
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    assert "8 sampled episodes (2 prompts × group of 4)" in capsys.readouterr().out
    (row,) = read_metrics(tmp_path / "p" / "rl" / "metrics.jsonl")
    assert row["rows"] >= 8 and abs(row["first_update_abs_log_ratio"]) < 1e-3
