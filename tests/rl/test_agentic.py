"""Agentic GRPO on tiny models: multi-turn episodes through dsv32.agent in an environment, rows whose
training forward reproduces the sampling log-probs of every turn, zero gradient on tool results, a
mixed run with single-turn prompts, exact resume, deterministic batching."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from helpers.agentic import (
    SAMPLING,
    SETTINGS,
    TASKS,
    TEMPERATURE,
    EchoEnv,
    agentic_config,
    episodes_batch,
    train_tool_user,
)
from helpers.tolerances import ON_POLICY

from dsv32.rl.agentic.batcher import StepRecord
from dsv32.rl.agentic.episodes import (
    Row,
    episode_rows,
    episode_summary,
    rows_to_rollouts,
    run_episodes,
)
from dsv32.rl.agentic.trainer import train_agentic
from dsv32.rl.grpo.loss import grpo_loss, token_logprobs
from dsv32.runlog import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")


def _episodes(policy, n=6, seed=0, keep_routing=False):
    jobs = [(EchoEnv, TASKS[i % 4], "echo") for i in range(n)]
    gen = torch.Generator().manual_seed(seed)
    return run_episodes(policy, jobs, SAMPLING, SETTINGS, generator=gen, keep_routing=keep_routing)


# --------------------------------------------------------------------------------------- rows
def _rec(prompt, tokens):
    return StepRecord(prompt, tokens, [-0.5] * len(tokens), None, None, True)


def test_turns_that_extend_the_prompt_share_a_row_with_tool_results_masked():
    first = _rec([1, 2, 3], [10, 11])
    second = _rec([1, 2, 3, 10, 11, 50, 51], [12, 13])  # 50, 51: tool result + <think>
    rows = episode_rows([first, second])
    assert len(rows) == 1
    assert rows[0].ids == [1, 2, 3, 10, 11, 50, 51, 12, 13]
    assert rows[0].actions == [True, True, False, False, True, True]
    assert rows[0].logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5, -0.5]
    # A re-rendered context (the reply tokenized differently, a context reset) starts a new row.
    third = _rec([1, 2, 3, 99, 11, 50, 51], [14])
    rows = episode_rows([first, third])
    assert [r.prompt for r in rows] == [[1, 2, 3], [1, 2, 3, 99, 11, 50, 51]]
    assert [r.actions for r in rows] == [[True, True], [True]]


def test_rollout_layout_of_rows():
    rows = [
        Row(
            [1, 2],
            [5, 6, 7],
            [True, False, True],
            [-1.0, 0.0, -2.0],
            [torch.full((3, 1), -1, dtype=torch.int32)],
        )
    ]
    rows.append(Row([3], [8], [True], [-3.0], [torch.full((1, 1), -1, dtype=torch.int32)]))
    from dsv32.rl.grpo.tasks import Task as RLTask

    t = RLTask("x", "d", "p")
    batch = rows_to_rollouts(rows, [t, t], 0, "cpu", with_kept=False)
    assert batch.start == 2 and batch.sequences.tolist() == [[1, 2, 5, 6, 7], [0, 3, 8, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 0, 0]]
    assert batch.action_mask.tolist() == [[True, False, True], [True, False, False]]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device (CUDA)")
def test_kept_sets_sampled_on_the_gpu_join_the_cpu_context_of_a_row():
    from dsv32.rl.grpo.tasks import Task as RLTask

    def on_gpu(rows):
        return torch.tensor(rows, dtype=torch.int32, device="cuda")

    first = StepRecord([1, 2], [10, 11], [-0.5, -0.5], on_gpu([[7, 8], [9, -1]]), None, True)
    second = StepRecord([1, 2, 10, 11, 50], [12], [-0.5], on_gpu([[5]]), None, True)  # 50: context
    batch = rows_to_rollouts(episode_rows([first, second]), [RLTask("x", "d", "p")], 0, "cpu", with_kept=True)
    assert batch.kept_ids.tolist() == [[[7, 8], [9, -1], [-1, -1], [5, -1]]]


# --------------------------------------------------------------------------------------- on-policy
def test_the_training_forward_reproduces_the_sampling_logprobs_of_every_turn(tool_user):
    episodes = _episodes(tool_user)
    summary = episode_summary(episodes)
    assert summary["tool_call_valid"] > 0.5, summary  # the memorized model calls the tool: multi-turn
    rows, batch = episodes_batch(tool_user, episodes)
    multi = [r for r in rows if any(not a for a in r.actions)]
    assert multi, "no row holds two turns with a tool result between them"
    with torch.no_grad():
        logp = tool_user.action_logprobs(**batch.rows(torch.arange(len(batch))), temperature=TEMPERATURE)
    m = batch.action_mask
    diff = (logp - batch.sampling_logprobs)[m].abs()
    assert diff.max() < ON_POLICY, float(diff.max())
    # every turn, not only the first: action tokens after a masked tool result are checked too
    after_tool = m & (torch.cumsum((~m).int(), -1) > 0)
    assert bool(after_tool.any())


def test_tool_result_tokens_get_zero_gradient(tool_user):
    episodes = _episodes(tool_user, n=4, seed=1)
    rows, batch = episodes_batch(tool_user, episodes)
    idx = torch.arange(len(batch))
    r = batch.rows(idx)
    ids, mask = r["sequences"][:, :-1], r["attention_mask"][:, :-1]
    T = r["sequences"].shape[1] - batch.start
    positions = (mask.long().cumsum(-1) - 1).clamp_min(0)
    out = tool_user.model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=T)
    logits = out.logits
    logits.retain_grad()
    # the full softmax: the memorized model often keeps one token, whose renormalized log-prob is constant
    logp = token_logprobs(logits, r["sequences"][:, batch.start :], None, TEMPERATURE)
    adv = torch.linspace(-1, 1, len(batch))
    loss, _ = grpo_loss(logp, batch.sampling_logprobs, adv, batch.action_mask)
    loss.backward()
    per_position = logits.grad.abs().sum(-1)  # [B, T]: gradient reaching each predicted token
    context = batch.attention_mask[:, batch.start :].bool() & ~batch.action_mask
    assert bool(context.any())
    assert per_position[context].max() == 0  # tool results, <think>: no gradient at all
    assert per_position[batch.action_mask].sum() > 0


def test_an_episode_whose_environment_fails_to_score_is_kept_but_not_scored(tool_user):
    class Broken(EchoEnv):
        def reward(self, trajectory):
            raise RuntimeError("verifier crashed")

    jobs = [(Broken if i == 0 else EchoEnv, TASKS[0], "echo") for i in range(2)]
    episodes = run_episodes(tool_user, jobs, SAMPLING, SETTINGS, generator=torch.Generator().manual_seed(0))
    assert [e.scored for e in episodes] == [False, True]
    assert episodes[0].records and "verifier crashed" in episodes[0].trajectory.error
    assert episode_summary(episodes)["not_scored"] == 1


def test_batching_does_not_depend_on_thread_timing(tool_user):
    a = [e.records for e in _episodes(tool_user, n=4, seed=3)]
    b = [e.records for e in _episodes(tool_user, n=4, seed=3)]
    assert [[r.tokens for r in recs] for recs in a] == [[r.tokens for r in recs] for recs in b]


# --------------------------------------------------------------------------------------- the loop
def test_mixed_run_trains_on_policy_and_resumes_exactly(tool_user, tmp_path):
    import copy

    start = copy.deepcopy(tool_user.model.state_dict())
    full = train_agentic(agentic_config(tmp_path / "a"), policy=tool_user, progress=False)
    tool_user.model.load_state_dict(start)
    cfg = agentic_config(tmp_path / "b")
    part = train_agentic(cfg, policy=tool_user, progress=False, stop_after=1, evaluate_after=False)
    tool_user.model.load_state_dict(start)
    rest = train_agentic(cfg, policy=tool_user, progress=False)
    assert part.steps == 1 and rest.steps == 2
    a, b = read_metrics(full.out_dir / "metrics.jsonl"), read_metrics(rest.out_dir / "metrics.jsonl")
    for ra, rb in zip(a, b):
        assert ra["reward_mean"] == rb["reward_mean"] and ra["pg_loss"] == rb["pg_loss"]
    for r in a:
        assert r["first_update_abs_log_ratio"] < ON_POLICY  # on-policy: training forward = sampling
        assert set(r["reward_by_domain"]) <= {"echo-test", "math"}
    assert full.eval_before["episodes"] == 2 and "tool_call_valid" in full.eval_after
    assert (full.out_dir / "rl.png").is_file() and (full.out_dir / "model").is_dir()


def test_the_update_sees_each_episode_as_one_output(tool_user, tmp_path, monkeypatch):
    """Every row carries its output's place in the step as sequence id (an episode in several rows is
    one output o_i of the loss); single-turn samples are outputs of their own."""
    import dsv32.rl.grpo.trainer as trainer

    seen = []

    def spy(policy, optimizer, batch, advantages, cfg, **kwargs):
        seen.append((batch, advantages, kwargs["sequence_ids"]))
        return real(policy, optimizer, batch, advantages, cfg, **kwargs)

    real = trainer.grpo_update
    monkeypatch.setattr(trainer, "grpo_update", spy)
    envs = [{"name": "echo-test", "tasks": "train", "weight": 1.0}]
    cfg = agentic_config(
        tmp_path, **{"grpo.steps": 1, "grpo.prompts_per_step": 4, "envs": envs, "agentic.eval_tasks": 0}
    )
    train_agentic(cfg, policy=tool_user, progress=False, evaluate_before=False, evaluate_after=False)
    ((batch, advantages, ids),) = seen
    assert ids is not None and ids.shape == (len(batch),)
    episode = [i for i, t in enumerate(batch.tasks) if t.domain == "echo-test"]
    single = [i for i, t in enumerate(batch.tasks) if t.domain != "echo-test"]
    assert episode and single and episode == list(range(len(episode)))  # episode rows come first
    episode_ids = ids[episode].tolist()
    assert episode_ids == sorted(episode_ids)  # episode i's rows, then episode i + 1's
    for i in set(episode_ids):
        assert len(set(advantages[ids == i].tolist())) == 1  # the rows of an episode share its advantage
    assert len(set(ids[single].tolist())) == len(single) and not set(ids[single].tolist()) & set(episode_ids)
    # item k's j-th output is output k·G + j of the step (the order the mini-batches are drawn over),
    # episodes or single-turn samples alike
    assert set(ids.tolist()) == set(range(4 * 2))
    for k in range(4):
        assert len({batch.tasks[i].domain for i in (ids // 2 == k).nonzero().squeeze(1).tolist()}) == 1


def test_keep_routing_and_the_sampling_mask_hold_for_native_multi_turn(tmp_path):
    policy = train_tool_user("tiny-native", tmp_path)
    episodes = _episodes(policy, n=4, keep_routing=True)
    rows, batch = episodes_batch(policy, episodes)
    assert batch.routing is not None and batch.kept_ids is not None
    with torch.no_grad():
        logp = policy.action_logprobs(**batch.rows(torch.arange(len(batch))), temperature=TEMPERATURE)
    diff = (logp - batch.sampling_logprobs)[batch.action_mask].abs()
    assert diff.max() < ON_POLICY, float(diff.max())


@pytest.mark.parametrize("thinking", [True, False])
def test_single_turn_rewards_read_completions_in_the_policys_mode(tool_user, tmp_path, monkeypatch, thinking):
    """The single-turn domains' prompts are rendered in the policy's mode (``agentic.thinking``), so
    their rewards read the completions in that mode, whatever ``policy.thinking`` says."""
    import dsv32.rl.agentic.trainer as trainer

    seen = {}

    def spy(*args, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(trainer, "build_reward_fn", spy)
    monkeypatch.setattr(tool_user, "thinking", thinking)
    cfg = agentic_config(tmp_path, **{"policy.thinking": not thinking})
    with pytest.raises(RuntimeError, match="stop here"):
        train_agentic(cfg, policy=tool_user, progress=False)
    assert seen["thinking"] is thinking
