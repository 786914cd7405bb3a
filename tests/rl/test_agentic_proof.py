"""The post-training proof pipeline end to end on a tiny model (every stage, the report's keys), the
report itself (intervals, curve, transfer), the recipe's task sets, the format term of the reward,
and the on-policy check on episodes of two tool calls."""

from __future__ import annotations

import json
import re

import pytest
import torch

pytest.importorskip("transformers")

from helpers.agentic import memorized
from helpers.tolerances import ON_POLICY

from dsv32.agent.trajectory import Step, ToolRecord, Trajectory
from dsv32.cli import main
from dsv32.envs.base import EnvError, Environment, EnvSpec, Reward, Task, register, tool_call, tool_schema
from dsv32.posttrain.recipe import read_posttrain_recipe, refuse_shared
from dsv32.posttrain.report import (
    STAGES,
    first_tasks,
    paired_change,
    report_dict,
    report_markdown,
    rl_curve,
    wilson,
)
from dsv32.recipe import RecipeError
from dsv32.rl.agentic.episodes import (
    AgenticReward,
    Episode,
    EpisodeSettings,
    episode_rows,
    rl_task,
    rows_to_rollouts,
)
from dsv32.rl.grpo.rollout import SamplingConfig
from dsv32.runlog import read_metrics

KEYS = {f"{m}_{s}" for m in ("accuracy", "tool_call_valid", "interval") for s in STAGES} | {
    "heldout_tasks",
    "minutes",
    "rl_gain",
    "intervals_overlap",
    "transfer",
    "rl_curve",
}


def _evals(n=100):
    return {s: {"accuracy": 0.1 * i, "tool_call_valid": 0.2 * i, "used_tool": 0.3, "mean_steps": 2.0,
                "episodes": n} for i, s in enumerate(STAGES)}  # fmt: skip


DETAILS = {"evals": _evals(), "machine": {"cpus": 2, "torch_threads": 2, "load_average_1_5_15": [1, 1, 1]},
           "model": "m", "task": "t", "load_start": [1, 1, 1], "stage_minutes": {}, "command": "c",
           "cold_start": {"kept": 3, "tasks": 4}}  # fmt: skip


# --------------------------------------------------------------------------------------- the report
def test_wilson_interval_matches_the_textbook_values():
    assert wilson(50, 100) == (0.4038, 0.5962)
    assert wilson(0, 24) == (0.0, 0.138)  # not empty at 0 successes, unlike the normal approximation
    assert wilson(24, 24) == (0.862, 1.0)
    with pytest.raises(ValueError, match="at least one"):
        wilson(0, 0)
    with pytest.raises(ValueError, match="successes"):
        wilson(5, 4)


def test_report_has_every_key_and_needs_every_stage():
    report = report_dict(_evals(), 100, 12.345, DETAILS)
    assert set(report) >= KEYS and report["minutes"] == 12.35 and report["accuracy_rl"] == pytest.approx(0.2)
    assert report["interval_rl"] == list(wilson(20, 100)) and report["rl_gain"] == pytest.approx(0.1)
    assert report["intervals_overlap"]  # 0.1 [0.055, 0.174] and 0.2 [0.133, 0.289]
    assert "| after agentic GRPO | 0.200 | [0.133, 0.289] | 0.400 |" in report_markdown(report)
    with pytest.raises(ValueError, match="missing"):
        report_dict({"base": _evals()["base"]}, 24, 1.0, DETAILS)


def test_report_says_when_the_intervals_separate_and_carries_transfer_and_curve():
    evals = _evals()
    evals["sft"]["accuracy"], evals["rl"]["accuracy"] = 0.40, 0.70
    transfer = {"env": "general-tools", "tasks": 8, **{f"accuracy_{s}": 0.0 for s in STAGES},
                **{f"tool_call_valid_{s}": 0.125 for s in STAGES}}  # fmt: skip
    metrics = [
        {"step": 1, "reward_mean": 0.5, "accuracy": 0.4, "tool_call_valid": 0.6, "kl": 2e-4},
        {"step": 2},
    ]
    points = [
        {**evals["sft"], "step": 0},
        {"step": 2, "accuracy": 0.55, "tool_call_valid": 0.9, "episodes": 100},
    ]
    grpo = {"steps": 2, "prompts_per_step": 16, "group_size": 4, "lr": 1e-5, "kl_coef": 0.2}
    details = DETAILS | {"grpo": grpo}
    report = report_dict(evals, 100, 1.0, details, transfer=transfer, curve=rl_curve(metrics, points))
    assert not report["intervals_overlap"] and report["rl_gain"] == pytest.approx(0.3)
    assert [p["step"] for p in report["rl_curve"]["heldout"]] == [0, 2]
    assert report["rl_curve"]["heldout"][1]["interval"] == list(wilson(55, 100))
    assert [r["step"] for r in report["rl_curve"]["train"]] == [1]  # a record without a reward is no point
    text = report_markdown(report)
    assert "+0.300 absolute; the two intervals do not overlap" in text
    assert "Transfer (never trained on): general-tools, 8 tasks" in text and "step 2: 0.550" in text
    assert report["rl_curve"]["train"][0]["kl"] == 2e-4
    assert "2 steps of 16 tasks × 4 episodes, lr 1e-05, KL toward the SFT model β = 0.2" in text
    assert "(mean KL per step: 2.0e-04)" in text
    no_kl = report_dict(
        evals, 100, 1.0, DETAILS | {"grpo": grpo | {"kl_coef": 0.0}}, curve=rl_curve(metrics, points)
    )
    assert "lr 1e-05, no KL term." in report_markdown(no_kl)


def _outcomes(solved: str) -> dict:
    return {"outcomes": [{"id": f"t{i}", "correct": c == "1"} for i, c in enumerate(solved)]}


def test_the_curve_counts_an_evaluation_over_its_first_tasks():
    summary = {"episodes": 4, "accuracy": 0.5, "tool_call_valid": 0.75, "outcomes": [
        {"id": "a", "correct": True, "tool_call_valid": True}, {"id": "b", "correct": False, "tool_call_valid": False},
        {"id": "c", "correct": True, "tool_call_valid": True}, {"id": "d", "correct": False, "tool_call_valid": True},
    ]}  # fmt: skip
    assert first_tasks(summary, 3) == {"episodes": 3, "accuracy": 2 / 3, "tool_call_valid": 2 / 3}
    assert first_tasks(summary, 4) is summary and first_tasks(summary, 9) is summary
    with pytest.raises(ValueError, match="n >= 1"):
        first_tasks(summary, 0)
    point = rl_curve([], [{**first_tasks(summary, 3), "step": 0}])["heldout"][0]
    assert point["tasks"] == 3 and point["interval"] == list(wilson(2, 3))


def test_the_paired_comparison_counts_the_tasks_only_one_stage_solved():
    # 10 tasks: 7 only the second solved, 1 only the first; exact McNemar: 2 · P(X ≤ 1 | 8, 1/2)
    paired = paired_change(_outcomes("1100000000"), _outcomes("0111111110"))
    assert paired == {"solved_only_after": 7, "solved_only_before": 1, "mcnemar_p": 0.07031}  # 2 · 9 / 256
    one_sided = paired_change(_outcomes("0" * 23), _outcomes("1" * 23))
    assert one_sided["mcnemar_p"] == 2.384e-07 and one_sided["solved_only_before"] == 0  # 2 / 2^23, not 0
    assert paired_change(_outcomes("10"), _outcomes("10"))["mcnemar_p"] == 1.0  # no discordant task
    assert paired_change(_outcomes("10"), _outcomes("100")) is None  # not the same tasks
    assert paired_change({}, _outcomes("1")) is None
    evals = _evals()
    evals["sft"] |= _outcomes("1100000000")
    evals["rl"] |= _outcomes("0111111110")
    report = report_dict(evals, 10, 1.0, DETAILS)
    assert report["rl_vs_sft_paired"]["solved_only_after"] == 7
    assert "GRPO solved 7 held-out tasks SFT had not and lost 1" in report_markdown(report)


# --------------------------------------------------------------------------------------- the recipe
SHIPPED = "configs/posttrain-agentic-smollm2.toml"


def test_the_agentic_recipe_keeps_held_out_and_validation_prompts_out_of_training(tmp_path):
    recipe = read_posttrain_recipe(SHIPPED, [], str(tmp_path))
    train, heldout = recipe.generate_tasks()
    validation = recipe.validation_tasks(train)
    assert len(heldout) >= 100 and validation and recipe.transfer is not None
    prompts = {t.prompt for t in train}
    assert not prompts & {t.prompt for t in heldout} and not prompts & {t.prompt for t in validation}
    assert {t.info["category"] for t in heldout} == {"chain"}
    assert {t.info["difficulty"] for t in heldout} == {1, 2, 3, 4, 5}  # the difficulty spread
    assert all(len(t.info["solution_cells"]) == 2 for t in train)  # two cells: two tool calls
    cold = recipe.coldstart_tasks(train)
    assert 0 < len(cold) < len(train) and cold == train[: len(cold)]
    # the code interpreter of every stage gets the recipe's system prompt, GRPO's environment too
    assert recipe.rl.envs[0].options == {"system_prompt": "short"}
    assert recipe.rl.agentic.format_weight > 0 and not recipe.rl_model.train_embeddings
    with pytest.raises(RecipeError, match="repeat 1 training prompt"):
        refuse_shared(train, [heldout[0], train[3]], "held-out")
    assert 0 < recipe.tasks.curve_tasks < len(heldout)  # the curve counts the first held-out tasks
    fewer = read_posttrain_recipe(SHIPPED, ["tasks.heldout=5"], str(tmp_path))
    assert fewer.tasks.curve_tasks == 5  # a quick run with fewer held-out tasks: the curve counts them all


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("tasks.coldstart=1000", "more than the"),
        ("transfer.env='code-interpreter'", "does not train on"),
        ("transfer.set='nope'", "task sets"),
        ("tasks.system_prompt='tiny'", "system_prompt"),
        ("tasks.rl_pool='hard'", "rl_pool"),
        ("tasks.rl_pool_solved=1.0", "rl_pool_solved"),
        ("tasks.curve=-1", "curve"),
    ],
)
def test_bad_recipe_values_are_refused_before_anything_runs(tmp_path, override, message):
    with pytest.raises(RecipeError, match=message):
        read_posttrain_recipe(SHIPPED, [override], str(tmp_path))
    assert not tmp_path.joinpath("tasks_train.jsonl").exists()


# --------------------------------------------------------------------------------------- the pipeline
def test_the_proof_pipeline_evaluates_every_stage_on_the_same_held_out_tasks(tmp_path, capsys, monkeypatch):
    import dsv32.rl.agentic.trainer as trainer

    seen: list[tuple[str, ...]] = []
    real = trainer.evaluate_agentic

    def recording(policy, items, settings, max_new_tokens):
        seen.append(tuple(it.task.id for it in items))
        return real(policy, items, settings, max_new_tokens)

    monkeypatch.setattr(trainer, "evaluate_agentic", recording)
    sets = ["sft.model.name=tiny-llama", "sft.train.freeze_layers=0", "sft.data.seq_len=1024", "sft.train.epochs=1",
            "tasks.train=3", "tasks.coldstart=2", "tasks.validation=1", "tasks.heldout=2", "rl.grpo.steps=2",
            "rl.eval.every=1", "rl.grpo.prompts_per_step=1", "rl.grpo.group_size=2", "rl.grpo.mini_batches=1",
            "rl.sampling.max_new_tokens=16", "transfer.tasks=1", "transfer.max_steps=1", "tasks.curve=1"]  # fmt: skip
    argv = ["posttrain", "proof", SHIPPED, "--out", str(tmp_path / "p"), "--no-progress"]
    assert main([*argv, *[a for s in sets for a in ("--set", s)]]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(printed) >= KEYS and printed["heldout_tasks"] == 2
    report = json.loads((tmp_path / "p" / "report.json").read_text())
    assert report["details"]["cold_start"]["kept"] == 2 and report["details"]["tasks"]["validation"] == 1
    held = [
        json.loads(line)["id"] for line in (tmp_path / "p" / "tasks_heldout.jsonl").read_text().splitlines()
    ]
    # base, sft, rl: the same held-out tasks each time; the trainer's evaluation after step 1: the
    # first of them (tasks.curve = 1); the transfer environment's own tasks after each stage; the SFT
    # model's greedy pass over the training tasks (the recipe's GRPO pool is the tasks it leaves
    # unsolved)
    held_calls = [ids for ids in seen if ids == tuple(held)]
    train_ids = tuple(
        json.loads(line)["id"] for line in (tmp_path / "p" / "tasks_train.jsonl").read_text().splitlines()
    )
    assert len(held_calls) == 3 and seen.count(tuple(held[:1])) == 1
    assert seen.count(train_ids) == 1 and len(seen) == 4 + 3 + 1
    assert all(not set(ids) & set(held) for ids in seen if not set(ids) <= set(held))
    curve = report["rl_curve"]["heldout"]
    assert [p["step"] for p in curve] == [0, 1, 2] and {p["tasks"] for p in curve} == {1}
    for point, stage in ((curve[0], "sft"), (curve[2], "rl")):  # the stage's outcome on the first task
        first = json.loads((tmp_path / "p" / f"eval_{stage}.json").read_text())["outcomes"][0]
        assert point["accuracy"] == float(first["correct"]) and point["interval"] == list(
            wilson(int(first["correct"]), 1)
        )
    assert (
        "Held-out accuracy during GRPO (the first 1 held-out tasks)"
        in (tmp_path / "p" / "report.md").read_text()
    )
    for stage in STAGES:  # every held-out task's outcome, in the order of the held-out set
        outcomes = json.loads((tmp_path / "p" / f"eval_{stage}.json").read_text())["outcomes"]
        assert [o["id"] for o in outcomes] == held and all(isinstance(o["correct"], bool) for o in outcomes)
    assert report["rl_vs_sft_paired"] is not None and "outcomes" not in report["details"]["evals"]["rl"]
    # rl_model.train_embeddings = false: GRPO moved the upper layers, never the (tied) embeddings
    from transformers import AutoModelForCausalLM

    from dsv32.train.sft.model import vocab_matrices

    sft, rl = (AutoModelForCausalLM.from_pretrained(tmp_path / "p" / d / "model") for d in ("sft", "rl"))
    assert torch.equal(sft.get_input_embeddings().weight, rl.get_input_embeddings().weight)
    vocab = {id(p) for p in vocab_matrices(sft)}
    trained = sum(p.numel() for p in sft.parameters() if id(p) not in vocab)
    assert (
        report["details"]["rl_trained_parameters"] == trained
    )  # every layer (freeze_layers = 0), no vocab row
    assert set(report["transfer"]) >= {f"accuracy_{s}" for s in STAGES}
    assert any(r.get("eval_loss") is not None for r in read_metrics(tmp_path / "p" / "sft" / "metrics.jsonl"))
    for name in (
        "report.md",
        "report.png",
        "sft/model/tokenizer.json",
        "rl/metrics.jsonl",
        "tasks_validation.jsonl",
    ):
        assert (tmp_path / "p" / name).exists(), name
    train = (tmp_path / "p" / "tasks_train.jsonl").read_text()
    for name in ("tasks_heldout.jsonl", "tasks_validation.jsonl"):
        prompts = [json.loads(line)["prompt"] for line in (tmp_path / "p" / name).read_text().splitlines()]
        assert not any(p in train for p in prompts)


@pytest.mark.parametrize(
    ("solved", "share"),
    [
        ({"train-0-0001"}, 0.0),
        ({"train-0-0001"}, 0.5),
        ({"train-0-0000", "train-0-0001", "train-0-0002"}, 0.5),
    ],
)
def test_grpo_draws_from_the_training_tasks_sft_left_unsolved(tmp_path, capsys, monkeypatch, solved, share):
    import dsv32.rl.agentic.trainer as trainer

    real_eval, real_run = trainer.evaluate_agentic, trainer.run_episodes
    train_ids = ["train-0-0000", "train-0-0001", "train-0-0002"]

    def sft_solves(policy, items, settings, max_new_tokens):  # as if SFT solved `solved` greedily
        out = real_eval(policy, items, settings, max_new_tokens)
        for o in out["outcomes"]:
            o["correct"] = o["id"] in solved
        return out

    drawn: list[str] = []

    def recording(policy, jobs, sampling, *args, **kwargs):
        if sampling.temperature > 0:  # GRPO's sampled episodes (every evaluation is greedy)
            drawn.extend(job[1].id for job in jobs)
        return real_run(policy, jobs, sampling, *args, **kwargs)

    monkeypatch.setattr(trainer, "evaluate_agentic", sft_solves)
    monkeypatch.setattr(trainer, "run_episodes", recording)
    sets = ["sft.model.name=tiny-llama", "sft.train.freeze_layers=0", "sft.data.seq_len=1024", "sft.train.epochs=1",
            "tasks.train=3", "tasks.coldstart=2", "tasks.validation=0", "tasks.heldout=1", "tasks.rl_pool='unsolved'",
            f"tasks.rl_pool_solved={share}", "rl.grpo.steps=3", "rl.eval.every=0", "rl.grpo.prompts_per_step=1", "rl.grpo.group_size=2",
            "rl.grpo.mini_batches=1", "rl.sampling.max_new_tokens=8", "transfer.tasks=1", "transfer.max_steps=1"]  # fmt: skip
    argv = ["posttrain", "proof", SHIPPED, "--out", str(tmp_path / "p"), "--no-progress"]
    assert main([*argv, *[a for s in sets for a in ("--set", s)]]) == 0
    pool = [json.loads(line)["id"] for line in (tmp_path / "p" / "tasks_rl.jsonl").read_text().splitlines()]
    expected = [t for t in train_ids if t not in solved] or train_ids  # all solved: nothing to filter on
    assert pool == expected
    solved_file = tmp_path / "p" / "tasks_rl_solved.jsonl"
    mixed = share > 0 and len(expected) < len(train_ids)
    assert solved_file.exists() == mixed
    if mixed:  # the solved tasks are a source of their own, drawn with weight share / (1 − share)
        assert [json.loads(x)["id"] for x in solved_file.read_text().splitlines()] == sorted(solved)
        assert len(drawn) == 3 * 2 and set(drawn) <= set(train_ids)
    else:
        assert len(drawn) == 3 * 2 and set(drawn) == set(pool[:3])  # 3 steps × G = 2, the pool in turn
    passed = json.loads((tmp_path / "p" / "rl_pool_sft.json").read_text())
    assert [o["id"] for o in passed["outcomes"]] == train_ids
    report = json.loads((tmp_path / "p" / "report.json").read_text())
    assert report["details"]["tasks"]["rl_pool"] == {
        "rule": "unsolved", "train": 3, "solved_by_sft": len(solved), "pool": len(expected),
        "solved_share": share if mixed else 0.0,
    }  # fmt: skip
    assert f"the {len(expected)} of 3 training tasks" in (tmp_path / "p" / "report.md").read_text()


def test_the_smoke_recipe_still_runs_every_stage_on_a_tiny_model(tmp_path, capsys):
    sets = ["sft.model.name=tiny-llama", "sft.train.freeze_layers=0", "sft.data.seq_len=1024", "sft.train.epochs=1",
            "tasks.train=2", "tasks.heldout=2", "rl.grpo.steps=1", "rl.grpo.prompts_per_step=1",
            "rl.grpo.group_size=2", "rl.grpo.mini_batches=1", "rl.sampling.max_new_tokens=16"]  # fmt: skip
    argv = ["posttrain", "proof", "--out", str(tmp_path / "p"), "--no-progress"]
    assert main([*argv, *[a for s in sets for a in ("--set", s)]]) == 0
    report = json.loads((tmp_path / "p" / "report.json").read_text())
    assert set(report) >= KEYS and report["transfer"] is None and report["details"]["cold_start"]["kept"] == 2


# --------------------------------------------------------------------------------------- the format term
def _episode(steps: list[Step], verifier: float = 0.0) -> Episode:
    trajectory = Trajectory(messages=[{"role": "assistant", "content": "x"}], final="x", steps=steps)
    return Episode(Task("t", "q"), "d", trajectory, verifier, [])


def _call(ok=True, error=None):
    return ToolRecord("python", "c", ok, error)


@pytest.mark.parametrize(
    ("steps", "form"),
    [
        ([Step(0, tool_calls=[_call()]), Step(1, tool_calls=[_call()]), Step(2)], 1.0),
        ([Step(0, tool_calls=[_call(False, "exception")]), Step(1)], 1.0),  # the code failed, not the markup
        ([Step(0)], 0.0),  # answered without calling the tool
        ([Step(0, tool_calls=[_call()]), Step(1, problems=[{"kind": "unclosed"}])], 0.0),  # a reply not V3.2
        ([Step(0, tool_calls=[_call(False, "bad_json")]), Step(1)], 0.0),
        ([Step(0, tool_calls=[_call(False, "unknown_tool")]), Step(1)], 0.0),
    ],
)
def test_the_format_term_rewards_well_formed_tool_use_only(steps, form):
    reward = AgenticReward(budget=100, format_weight=0.25)
    total, parts = reward(_episode(steps, verifier=1.0))
    assert parts["format"] == form and total == pytest.approx(1.0 + 0.25 * form)
    assert AgenticReward(budget=100)(_episode(steps, verifier=1.0))[0] == pytest.approx(1.0)  # off by default


# --------------------------------------------------------------------------------------- on-policy, two calls
class TwoCallEnv(Environment):
    """Tool ``f`` twice (the second result depends on the first call having run), then ``5``."""

    name = "two-call-test"

    def reset(self, task):
        self.task, self.calls = task, 0
        return [{"role": "system", "content": "s"}, {"role": "user", "content": task.prompt}]

    def tools(self):
        return [tool_schema("f", "A tool.", {}, [])]

    def call(self, name, arguments):
        if name != "f":
            return "error"
        self.calls += 1
        return f"R{self.calls}"

    def reward(self, trajectory):
        return Reward(float(self.calls == 2 and (trajectory.final or "").strip() == "5"), {}, "")

    def reference(self, task):
        turn = {"role": "assistant", "content": "", "reasoning_content": "a"}
        return [
            {**turn, "tool_calls": [tool_call("f", {}, "r0")]},
            {**turn, "tool_calls": [tool_call("f", {}, "r1")]},
            {"role": "assistant", "content": "5", "reasoning_content": "b"},
        ]


TWO_TASKS = [Task(f"t{i}", "q", "5", "two") for i in range(4)]
register(EnvSpec("two-call-test", "test env", TwoCallEnv, {"train": lambda: TWO_TASKS}))
TEMPERATURE = 0.5


@pytest.fixture(scope="module")
def two_call_policy(tmp_path_factory):
    """A tiny model taught (SFT, memorized) to call ``f`` twice and then answer ``5``."""
    from dsv32.envs.base import replay

    env = TwoCallEnv()
    conv = replay(env, TWO_TASKS[0], env.reference(TWO_TASKS[0])).messages
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield memorized("tiny-llama", conv, tmp_path_factory.mktemp("two"), steps=120)
    torch.set_num_threads(before)


def test_the_first_update_is_on_policy_on_every_turn_of_two_call_episodes(two_call_policy):
    from dsv32.rl.agentic.episodes import run_episodes

    policy = two_call_policy
    sampling = SamplingConfig(temperature=TEMPERATURE, top_p=0.9, top_k=0, max_new_tokens=128)
    jobs = [(TwoCallEnv, TWO_TASKS[i % 4], "two") for i in range(6)]
    episodes = run_episodes(
        policy, jobs, sampling, EpisodeSettings("bare", 4), generator=torch.Generator().manual_seed(0)
    )
    reward = AgenticReward(budget=400, length_weight=0.1, format_weight=0.5)
    scored = [reward(e) for e in episodes]
    assert any(parts["format"] == 1.0 for _, parts in scored)
    rows, tasks = [], []
    for e in episodes:
        for row in episode_rows(e.records):
            rows.append(row)
            tasks.append(rl_task(e))
    batch = rows_to_rollouts(rows, tasks, policy.pad_token_id, policy.device, with_kept=True)
    m = batch.action_mask
    # rows holding three turns: two tool results (masked) between sampled turns
    segments = ((m[:, 1:] & ~m[:, :-1]).sum(-1) + m[:, 0].long()).tolist()
    assert max(segments) >= 3, segments
    with torch.no_grad():
        logp = policy.action_logprobs(**batch.rows(torch.arange(len(batch))), temperature=TEMPERATURE)
    diff = (logp - batch.sampling_logprobs).abs()
    turn = torch.cumsum((m[:, 1:] & ~m[:, :-1]).long(), -1)  # which sampled turn a position belongs to
    turn = torch.cat([torch.zeros_like(turn[:, :1]), turn], -1)
    for k in range(3):  # every turn of every row, the third (after the second tool result) included
        sel = m & (turn == k)
        assert bool(sel.any()) and float(diff[sel].max()) <= ON_POLICY, (k, float(diff[sel].max()))


@pytest.mark.parametrize("kl_coef", [0.0, 0.3])
def test_agentic_grpo_with_the_format_term_trains_on_policy(two_call_policy, tmp_path, kl_coef):
    import copy

    from dsv32.rl.agentic.config import load_agentic_config
    from dsv32.rl.agentic.trainer import train_agentic

    sets = {"out_dir": str(tmp_path / "run"), "agentic.prompt": "bare", "agentic.max_steps": 4,
            "agentic.eval_tasks": 0, "agentic.format_weight": 0.5, "agentic.length_weight": 0.1,
            "envs": [{"name": "two-call-test", "tasks": "train", "eval_tasks": ""}], "grpo.steps": 2,
            "grpo.prompts_per_step": 2, "grpo.group_size": 2, "grpo.mini_batches": 1, "grpo.lr": 1e-3,
            "grpo.kl_coef": kl_coef,
            "sampling.temperature": 1.5 if kl_coef else TEMPERATURE, "sampling.top_p": 0.9, "sampling.max_new_tokens": 128,
            "sampling.max_total_tokens": 400}  # fmt: skip
    cfg = load_agentic_config(None, [f"{k}={json.dumps(v)}" for k, v in sets.items()])
    start = copy.deepcopy(two_call_policy.model.state_dict())
    try:
        train_agentic(
            cfg, policy=two_call_policy, progress=False, evaluate_before=False, evaluate_after=False
        )
    finally:
        two_call_policy.model.load_state_dict(start)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert len(records) == 2
    for r in records:
        assert r["first_update_abs_log_ratio"] <= ON_POLICY and r["mean_steps"] >= 2
        # the reward holds the format term: above the verifier's share when the markup was well formed
        assert r["reward_mean"] > r["accuracy"] or r["tool_call_valid"] == 0
    # the KL term toward the starting policy (sampled hotter, so that the rewards differ and the
    # policy moves): nothing on the first step's on-policy update, then a positive penalty once the
    # policy has moved; none at all without a coefficient
    assert records[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert (records[1]["kl"] > 1e-6 and records[1]["kl_loss"] > 0) if kl_coef else records[1]["kl"] == 0.0


# --------------------------------------------------------------------------------------- the tasks
def test_chain_tasks_take_two_cells_of_the_notebook_and_their_references_verify():
    from dsv32.envs.base import replay
    from dsv32.envs.interpreter import InterpreterEnv, generate
    from dsv32.envs.interpreter.env import SHORT_SYSTEM_PROMPT

    tasks = generate(6, seed=3, categories=("chain",), prefix="c")
    assert generate(6, seed=3, categories=("chain",), prefix="c") == tasks  # deterministic
    assert [t.info["difficulty"] for t in tasks] == [1, 2, 3, 4, 5, 1]
    with InterpreterEnv(system_prompt="short") as env:
        for task in tasks:
            episode = replay(env, task, env.reference(task))
            calls = [m for m in episode.messages if m["role"] == "tool"]
            assert len(calls) == 2 and env.reward(episode).value == 1.0, (task.prompt, episode.messages)
            x, y = (int(n) for n in re.findall(r"\d+", task.prompt)[:2])
            assert calls[0]["content"].strip() == str(x * y)  # the second cell reads the first's a
        assert env.reset(tasks[0])[0]["content"] == SHORT_SYSTEM_PROMPT.format()
    with pytest.raises(EnvError, match="system_prompt"):
        InterpreterEnv(system_prompt="tiny")


def test_posttrain_rl_says_the_unsolved_pool_is_a_stage_of_the_proof(tmp_path, capsys):
    argv = ["posttrain", "rl", SHIPPED, "--policy", "no-such-model", "--out", str(tmp_path / "r")]
    code = main([*argv, "--set", "tasks.rl_pool='unsolved'"])
    out = capsys.readouterr()
    assert code != 0 and "cannot load model 'no-such-model'" in out.err
    assert "rl_pool = 'unsolved' is a stage of the proof" in out.out
