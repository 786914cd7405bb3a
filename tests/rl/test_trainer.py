"""The GRPO loop end to end on tiny models: Keep Sampling Mask and Keep Routing through the real engine
and training forward, a reward that rises, exact resume, multi-turn masking, the CLI."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from helpers.rl import LETTER_TASKS, LetterReward, letter_recipe
from helpers.tolerances import ON_POLICY

from dsv32.rl.grpo.loss import kept_log_mass
from dsv32.rl.grpo.policy import load_policy
from dsv32.rl.grpo.rollout import SamplingConfig, rollout
from dsv32.rl.grpo.single_turn import train_grpo
from dsv32.rl.grpo.tasks import Task


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-native"])
def test_keep_sampling_mask_makes_the_on_policy_ratio_exactly_one(name):
    policy = load_policy(name, device="cpu")
    params = SamplingConfig(temperature=0.8, top_p=0.7, top_k=40, max_new_tokens=12)
    batch = rollout(policy, LETTER_TASKS, 3, params, generator=torch.Generator().manual_seed(0))
    mask = batch.action_mask
    assert bool(mask.any()) and batch.kept_ids is not None
    with torch.no_grad():
        masked = policy.action_logprobs(**batch.rows(torch.arange(len(batch))), temperature=0.8)
        rows = batch.rows(torch.arange(len(batch))) | {"kept_ids": None}
        full = policy.action_logprobs(**rows, temperature=0.8)
        out = policy.model(batch.sequences[:, :-1], attention_mask=batch.attention_mask[:, :-1])
    log_ratio = (masked - batch.sampling_logprobs)[mask]
    assert log_ratio.abs().max() < ON_POLICY  # same action space: ratio 1 up to float noise
    # Without the mask the ratio is off by the log of the kept mass — the bias the mask removes.
    truncated = (batch.kept_ids >= 0).sum(-1) > 1
    mass = kept_log_mass(out.logits[:, batch.start - 1 :], batch.kept_ids, 0.8)
    torch.testing.assert_close((full - batch.sampling_logprobs)[mask], mass[mask], atol=1e-4, rtol=0)
    assert bool((mass[mask & truncated] < -1e-3).any())


def test_keep_routing_replays_the_recorded_experts_and_the_router_still_learns():
    policy = load_policy("tiny-native", device="cpu")
    params = SamplingConfig(temperature=1.0, max_new_tokens=10)
    batch = rollout(
        policy, LETTER_TASKS, 2, params, generator=torch.Generator().manual_seed(1), keep_routing=True
    )
    model = policy.model
    moe_layers = [layer.mlp for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    assert batch.routing.shape[:3] == (len(moe_layers), len(batch), batch.sequences.shape[1] - 1)
    with torch.no_grad():  # an update that flips routing: shift the selection bias
        for moe in moe_layers:
            moe.gate.e_score_correction_bias.add_(torch.randn_like(moe.gate.e_score_correction_bias) * 3)
    ids, attn = batch.sequences[:, :-1], batch.attention_mask[:, :-1]
    free = model(ids, attention_mask=attn, return_routing=True).routing
    real = attn.bool()
    assert bool((free.sort(-1).values != batch.routing.sort(-1).values).any(-1)[:, real].any())
    out = model(ids, attention_mask=attn, routing=batch.routing, return_routing=True)
    assert torch.equal(out.routing.sort(-1).values[:, real], batch.routing.sort(-1).values[:, real])
    out.logits[real].logsumexp(-1).mean().backward()
    for moe in moe_layers:
        assert moe.gate.weight.grad is not None and moe.gate.weight.grad.abs().sum() > 0


def test_grpo_raises_the_reward_on_a_trivial_task(tmp_path):
    cfg = letter_recipe(tmp_path, **{"grpo.steps": 15, "grpo.lr": 1e-2, "sampling.top_p": 1.0})
    result = train_grpo(cfg, reward_fn=LetterReward(), progress=False)
    rewards = [m["reward_mean"] for m in result.metrics]
    assert len(rewards) == 15
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.3, rewards
    m = result.metrics[-1]
    for key in ("kl", "clip_frac", "opsm_masked_frac", "ratio_mean", "length_mean", "rollout_s", "update_s"):
        assert key in m
    assert (tmp_path / "run" / "rl.png").is_file() and (tmp_path / "run" / "model").is_dir()


def test_exact_resume_and_reference_kl(tmp_path):
    over = {
        "grpo.steps": 4,
        "grpo.kl_coef": 0.05,
        "grpo.opsm_delta": 0.0,
        "sampling.top_p": 0.9,
        "save_every": 1,
    }
    straight = load_policy("tiny-llama", device="cpu")
    train_grpo(
        letter_recipe(tmp_path / "a", **over), policy=straight, reward_fn=LetterReward(), progress=False
    )
    first = train_grpo(
        letter_recipe(tmp_path / "b", **over), reward_fn=LetterReward(), progress=False, stop_after=2
    )
    assert first.steps == 2
    resumed = load_policy("tiny-llama", device="cpu")  # a fresh process: state comes from the checkpoint
    result = train_grpo(
        letter_recipe(tmp_path / "b", **over), policy=resumed, reward_fn=LetterReward(), progress=False
    )
    a = [json.loads(x) for x in (tmp_path / "a" / "run" / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in b] == [1, 2, 3, 4] and result.steps == 4
    for x, y in zip(a, b):
        for key in ("reward_mean", "pg_loss", "kl", "ratio_mean", "length_mean"):
            assert x[key] == pytest.approx(y[key], rel=1e-5, abs=1e-7), (key, x, y)
    for (n, p), (_, q) in zip(straight.model.named_parameters(), resumed.model.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=n)
    assert any(m["kl"] > 0 for m in a[1:])  # the policy moved away from the frozen reference


def test_recomputed_old_logprobs_top_k_and_std_advantages(tmp_path):
    over = {
        "grpo.steps": 2,
        "grpo.old_logprobs": "recompute",
        "grpo.advantage_scale": "std",
        "sampling.top_k": 20,
    }
    result = train_grpo(letter_recipe(tmp_path, **over), reward_fn=LetterReward(), progress=False)
    for m in result.metrics:  # π_old recomputed by the training forward: the first update is on-policy
        assert abs(m["first_update_ratio_mean"] - 1) < 1e-5 and m["first_update_abs_log_ratio"] < 1e-5
        assert m["later_updates_abs_log_ratio"] > 0


def test_multi_turn_hook_appends_tool_text_that_is_not_trained_on():
    policy = load_policy("tiny-llama", device="cpu")
    calls = []

    def hook(task, completion, turn):
        calls.append(turn)
        return "<tool>42</tool>" if turn == 0 else None

    params = SamplingConfig(temperature=1.0, max_new_tokens=6, max_turns=3, max_total_tokens=64)
    # A tiny random model rarely emits its end token: bias the head so that turns end.
    head = torch.nn.Linear(64, 257, bias=True)
    with torch.no_grad():
        head.weight.copy_(policy.model.lm_head.weight)
        head.bias.zero_()
        head.bias[256] = 6.0
    policy.model.lm_head = head
    batch = rollout(
        policy, LETTER_TASKS[:2], 2, params, generator=torch.Generator().manual_seed(3), hook=hook
    )
    tool = policy.encode("<tool>42</tool>")
    assert 0 in calls and any("<tool>42</tool>" in t for t in batch.completions)
    for i, text in enumerate(batch.completions):
        acts = batch.action_mask[i]
        tokens = batch.sequences[i, batch.start :]
        if "<tool>42</tool>" in text:
            # the tool tokens sit in the completion but are not actions
            joined = tokens.tolist()
            at = next(j for j in range(len(joined)) if joined[j : j + len(tool)] == tool)
            assert not bool(acts[at : at + len(tool)].any())
            assert bool(acts[:at].all()) and batch.sampling_logprobs[i, at : at + len(tool)].abs().sum() == 0
    with torch.no_grad():
        lp = policy.action_logprobs(**batch.rows(torch.arange(len(batch))))
    assert torch.isfinite(lp[batch.action_mask]).all()


def test_cli_rl_train_and_eval(tmp_path, capsys):
    from dsv32.cli import main

    recipe = tmp_path / "rl.toml"
    recipe.write_text(
        f'out_dir = "{tmp_path / "cli"}"\n[policy]\nname = "tiny-llama"\n[grpo]\nsteps = 2\nprompts_per_step = 2\n'
        "group_size = 2\nmini_batches = 2\n[sampling]\nmax_new_tokens = 6\n[eval]\nproblems = 4\nmax_new_tokens = 6\n"
        '[[sources]]\nkind = "arithmetic"\nmax_operand = 9\n'
    )
    assert main(["rl", "train", str(recipe), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "2 steps" in out and "held-out accuracy" in out
    rows = (tmp_path / "cli" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2 and (tmp_path / "cli" / "eval.jsonl").is_file()
    train_eval = (tmp_path / "cli" / "eval.jsonl").read_bytes()
    assert main(["rl", "eval", str(recipe), "--no-progress"]) == 0
    assert '"accuracy"' in capsys.readouterr().out
    assert (tmp_path / "cli" / "eval.jsonl").read_bytes() == train_eval  # the training run's log
    [row] = [json.loads(x) for x in (tmp_path / "cli" / "rl_eval.jsonl").read_text().splitlines()]
    assert row["policy"] == "tiny-llama" and row["step"] == 0
    assert main(["rl", "train", str(recipe), "--set", "grpo.group_size=1"]) == 2


def _steps(path):
    return [json.loads(x)["step"] for x in path.read_text().splitlines()]


def test_starting_over_replaces_the_previous_run_and_a_plain_run_resumes_the_new_one(tmp_path):
    run = tmp_path / "run"
    train_grpo(letter_recipe(tmp_path, **{"grpo.steps": 4}), reward_fn=LetterReward(), progress=False)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000004"]
    train_grpo(
        letter_recipe(tmp_path, **{"grpo.steps": 2}), reward_fn=LetterReward(), progress=False, resume=False
    )
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002"]
    assert _steps(run / "metrics.jsonl") == [1, 2]
    result = train_grpo(
        letter_recipe(tmp_path, **{"grpo.steps": 3}), reward_fn=LetterReward(), progress=False
    )
    assert result.steps == 3 and [m["step"] for m in result.metrics] == [3]
    assert _steps(run / "metrics.jsonl") == [1, 2, 3]


def test_resuming_with_other_settings_or_tasks_is_refused_before_anything_is_written(tmp_path):
    from dsv32.runlog import CheckpointError

    run = tmp_path / "run"
    train_grpo(letter_recipe(tmp_path, **{"grpo.steps": 1}), reward_fn=LetterReward(), progress=False)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(CheckpointError, match=r"belongs to another run \(grpo.lr 0.003 → 0.5\): start over"):
        train_grpo(letter_recipe(tmp_path, **{"grpo.lr": 0.5}), reward_fn=LetterReward(), progress=False)
    cfg = letter_recipe(tmp_path, **{"grpo.steps": 2})
    (tmp_path / "toy.jsonl").write_text(json.dumps({"prompt": "other", "domain": "toy"}) + "\n")
    with pytest.raises(CheckpointError, match=r"\(sources.0.sha256 "):
        train_grpo(cfg, reward_fn=LetterReward(), progress=False)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_a_resumed_run_logs_each_held_out_evaluation_once(tmp_path):
    from dsv32.rl.grpo.config import SourceConfig

    over = {"grpo.steps": 4, "save_every": 2, "eval.every": 1, "eval.problems": 2, "eval.max_new_tokens": 4}
    cfg = letter_recipe(tmp_path, **over)
    cfg.sources.append(SourceConfig(kind="arithmetic", max_operand=9, weight=0.5))

    def killed(record):
        if record["step"] == 4:  # after the held-out evaluation of step 3, before any of step 4
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_grpo(cfg, reward_fn=LetterReward(), progress=False, on_step=killed)
    eval_log = tmp_path / "run" / "eval.jsonl"
    assert _steps(eval_log) == [0, 1, 2, 3]  # the checkpoint is at step 2
    result = train_grpo(cfg, reward_fn=LetterReward(), progress=False)
    assert _steps(eval_log) == [0, 1, 2, 3, 4] and _steps(tmp_path / "run" / "metrics.jsonl") == [1, 2, 3, 4]
    assert result.eval_before["step"] == 0 and result.eval_after["step"] == 4
    train_grpo(cfg, reward_fn=LetterReward(), progress=False)  # the finished run again: nothing new
    assert _steps(eval_log) == [0, 1, 2, 3, 4]


# ------------------------------------------------------------------ outputs laid out in several rows
class GradientRecorder(torch.optim.Optimizer):
    """An optimizer whose step records the gradient (flattened) and leaves the parameters alone."""

    def __init__(self, params):
        super().__init__(params, {})
        self.grads: list[torch.Tensor] = []

    def step(self, closure=None):
        params = [p for g in self.param_groups for p in g["params"]]
        self.grads.append(
            torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])
        )


def _split_outputs_batch(policy):
    """Six rows of three outputs (ids 1, 0, 2, 1, 2, 1: output 0 in one row, 1 in three, 2 in two),
    with sampling log-probs set so that Eq. 9 at δ = 0.1 masks output 2 (divergence 0.15 on every
    token) and keeps output 1 (0.15 on its first, 2-token row only: 0.3 / 14 over the output)."""
    from dsv32.rl.agentic.episodes import Row, rows_to_rollouts

    g = torch.Generator().manual_seed(0)
    ids = torch.tensor([1, 0, 2, 1, 2, 1])
    lengths = [2, 5, 6, 6, 4, 6]
    rows = []
    for n in lengths:
        prompt = torch.randint(5, 90, (3,), generator=g).tolist()
        tokens = torch.randint(5, 90, (n + 1,), generator=g).tolist()
        actions = [True] * n
        actions.insert(n // 2, False)  # a context token (a tool result) inside the row
        rows.append(Row(prompt, tokens, actions, [0.0] * (n + 1)))
    batch = rows_to_rollouts(rows, [Task(id="t", domain="toy", prompt="p")] * 6, 0, "cpu", with_kept=False)
    with torch.no_grad():
        logp = policy.action_logprobs(**batch.rows(torch.arange(6)))
    offset = torch.zeros(6, 1)
    offset[0] = offset[2] = offset[4] = 0.15  # output 1's first row, both rows of output 2
    batch.sampling_logprobs = torch.where(batch.action_mask, logp + offset, 0.0)
    advantages = torch.tensor([1.0, -0.5, -0.5])[ids]  # output 0: +1; outputs 1, 2: -0.5
    return batch, advantages, ids


def _update(policy, batch, advantages, ids, **over):
    from dsv32.rl.grpo.config import GRPOConfig
    from dsv32.rl.grpo.update import grpo_update

    cfg = GRPOConfig(prompts_per_step=1, group_size=3, clip_grad=1e9, opsm_delta=0.1, keep_routing=False,
                     **{"mini_batches": 1, "micro_batch": 6} | over)  # fmt: skip
    opt = GradientRecorder(policy.model.parameters())
    records = grpo_update(
        policy, opt, batch, advantages, cfg, temperature=1.0, ref=None,
        generator=torch.Generator().manual_seed(0), sequence_ids=ids,
    )  # fmt: skip
    return opt.grads, records


def _loss_gradient(policy, batch, advantages, ids, rows):
    """The gradient of grpo_loss over ``rows`` in one forward, with their sequence ids."""
    from dsv32.rl.grpo.loss import grpo_loss

    policy.model.zero_grad(set_to_none=True)
    logp = policy.action_logprobs(**batch.rows(rows))
    s = batch.sampling_logprobs[rows]
    loss, metrics = grpo_loss(
        logp, s, advantages[rows], batch.action_mask[rows], sampling_logprobs=s, opsm_delta=0.1,
        sequence_ids=None if ids is None else ids[rows],
    )  # fmt: skip
    loss.backward()
    grad = torch.cat([p.grad.flatten() for p in policy.model.parameters()])
    policy.model.zero_grad(set_to_none=True)
    return grad, metrics


def test_an_output_split_across_micro_batches_is_one_output_of_the_update():
    """However its rows fall into micro-batches, the update's gradient and metrics are those of
    grpo_loss over the whole mini-batch with sequence ids: each output weighs 1/3, and Eq. 9 masks
    output 2 and keeps output 1 over all of their rows."""
    policy = load_policy("tiny-llama", device="cpu")
    batch, advantages, ids = _split_outputs_batch(policy)
    want, want_metrics = _loss_gradient(policy, batch, advantages, ids, torch.arange(6))
    assert want_metrics["opsm_masked_frac"] == pytest.approx(1 / 3)
    per_row, _ = _loss_gradient(policy, batch, advantages, None, torch.arange(6))
    assert not torch.allclose(per_row, want, rtol=1e-3, atol=1e-6)  # rows as outputs: another update
    for micro_batch in (1, 2, 4, 6):
        grads, (record,) = _update(policy, batch, advantages, ids, micro_batch=micro_batch)
        torch.testing.assert_close(grads[0], want, rtol=1e-4, atol=1e-7, msg=f"micro_batch={micro_batch}")
        for k in (
            "opsm_masked_frac",
            "pg_loss",
            "log_ratio_sampling",
            "clip_frac",
            "ratio_mean",
            "ratio_max",
        ):
            assert record[k] == pytest.approx(want_metrics[k], rel=1e-5, abs=1e-7), (micro_batch, k)


def test_all_rows_of_an_output_are_in_the_same_mini_batch():
    """Three mini-batches of three outputs: each optimizer step holds exactly one output's rows."""
    policy = load_policy("tiny-llama", device="cpu")
    batch, advantages, ids = _split_outputs_batch(policy)
    per_output = [
        _loss_gradient(policy, batch, advantages, ids, (ids == i).nonzero().squeeze(1))[0] for i in range(3)
    ]
    grads, records = _update(policy, batch, advantages, ids, mini_batches=3, micro_batch=2)
    assert len(records) == 3
    matched = sorted(
        next(i for i, want in enumerate(per_output) if torch.allclose(got, want, rtol=1e-4, atol=1e-7))
        for got in grads
    )
    assert matched == [0, 1, 2]
    assert sorted(r["opsm_masked_frac"] for r in records) == [0.0, 0.0, 1.0]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-native"])
def test_a_micro_batch_runs_only_the_columns_its_rows_use(name, monkeypatch):
    # Rows of a wide batch (a long prompt and a long episode elsewhere in it) go through the model
    # trimmed to their own columns: the same log-probs, 0 past the rows' end, a narrower forward.
    from dsv32.rl.agentic.episodes import Row, rows_to_rollouts
    from dsv32.rl.grpo import policy as policy_module

    policy = load_policy(name, device="cpu")
    g = torch.Generator().manual_seed(1)
    shapes = [(3, 5), (4, 3), (20, 4), (2, 30)]  # (prompt, tokens): the last two widen the batch
    rows = []
    for p, n in shapes:
        prompt = torch.randint(5, 90, (p,), generator=g).tolist()
        tokens = torch.randint(5, 90, (n,), generator=g).tolist()
        rows.append(Row(prompt, tokens, [True] * n, [0.0] * n))
    batch = rows_to_rollouts(rows, [Task(id="t", domain="toy", prompt="p")] * 4, 0, "cpu", with_kept=False)
    widths = []
    hook = policy.model.register_forward_pre_hook(
        lambda m, args, kwargs: widths.append((kwargs.get("input_ids", args[0] if args else None)).shape[1]),
        with_kwargs=True,
    )
    short = torch.tensor([0, 1])
    with torch.no_grad():
        trimmed = policy.action_logprobs(**batch.rows(short))
        monkeypatch.setattr(policy_module, "_used_columns", lambda mask, start: (0, mask.shape[1]))
        full = policy.action_logprobs(**batch.rows(short))
    hook.remove()
    assert widths[0] < widths[1] == batch.sequences.shape[1] - 1
    assert trimmed.shape == full.shape
    mask = batch.action_mask[short]
    assert torch.allclose(trimmed[mask], full[mask], atol=1e-5)
    assert not bool(trimmed[:, 5:].any())  # past the longer row's 5 tokens


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-native"])
def test_only_the_action_positions_go_through_the_head(name):
    # Multi-turn rows: actions, then tool text (not actions), then actions again. With the action
    # mask the head sees exactly the action positions, and log-probs and gradients are those of the
    # full head at those positions (0 elsewhere).
    from dsv32.rl.agentic.episodes import Row, rows_to_rollouts

    policy = load_policy(name, device="cpu")
    g = torch.Generator().manual_seed(2)
    rows = []
    for p, flags in [(4, [1, 1, 0, 0, 0, 1, 1]), (6, [1, 0, 1]), (3, [1, 1, 1, 1, 0, 0, 1, 1, 1])]:
        prompt = torch.randint(5, 90, (p,), generator=g).tolist()
        tokens = torch.randint(5, 90, (len(flags),), generator=g).tolist()
        rows.append(Row(prompt, tokens, [bool(f) for f in flags], [0.0] * len(flags)))
    batch = rows_to_rollouts(rows, [Task(id="t", domain="toy", prompt="p")] * 3, 0, "cpu", with_kept=False)
    seen = []
    head = policy.model.get_output_embeddings() if name == "tiny-llama" else policy.model.lm_head
    hook = head.register_forward_hook(lambda m, args, logits: seen.append(logits.shape[:-1]))
    params = [p for p in policy.model.parameters() if p.requires_grad]
    every = torch.arange(3)
    out = {}
    for key, kwargs in (("masked", batch.rows(every)), ("full", {**batch.rows(every), "action_mask": None})):
        policy.model.zero_grad()
        logp = policy.action_logprobs(**kwargs)
        (logp * batch.action_mask).sum().backward()
        out[key] = (logp.detach(), [None if p.grad is None else p.grad.clone() for p in params])
    hook.remove()
    mask = batch.action_mask
    assert seen[0] == (int(mask.sum()),) and seen[1] == (3, batch.sequences.shape[1] - batch.start)
    masked, full = out["masked"][0], out["full"][0]
    assert torch.allclose(masked[mask], full[mask], atol=1e-5) and not bool(masked[~mask].any())
    assert bool(
        full[~mask & (batch.attention_mask[:, batch.start :] > 0)].ne(0).any()
    )  # the full head scored them
    grads = list(zip(out["masked"][1], out["full"][1], strict=True))
    assert sum(a is not None for a, _ in grads) > 0
    for a, b in grads:  # a parameter the loss does not reach (an expert nothing routed to) has none
        assert (a is None) == (b is None) and (a is None or torch.allclose(a, b, rtol=1e-4, atol=1e-6))


def _frozen_trunk_policy():
    """tiny-llama (2 layers) with its embeddings (tied to the head) and lowest layer frozen."""
    from dsv32.train.sft.model import freeze_lower_layers, vocab_matrices

    policy = load_policy("tiny-llama", device="cpu")
    freeze_lower_layers(policy.model, 1)
    for p in vocab_matrices(policy.model):
        p.requires_grad_(False)
    return policy


def test_a_frozen_trunk_is_found_and_a_forward_from_its_states_matches_the_full_one():
    policy = load_policy("tiny-llama", device="cpu")
    assert policy.frozen_trunk() == 0  # everything trains
    policy = _frozen_trunk_policy()
    assert policy.frozen_trunk() == 1
    assert load_policy("tiny-native", device="cpu").frozen_trunk() == 0
    batch, _, _ = _split_outputs_batch(policy)
    lowest = policy.model.get_decoder().layers[0]
    calls = []
    hook = lowest.register_forward_hook(lambda m, args, out: calls.append(1))
    rows = torch.tensor([1, 3, 4])  # a subset: trimmed to its own columns
    states = policy.trunk_states(batch.sequences, batch.attention_mask, batch.start, 1)
    assert states.shape[:2] == (len(batch), batch.sequences.shape[1] - 1) and len(calls) == 1
    with_trunk = policy.action_logprobs(**batch.rows(rows), trunk=(states[rows], 1))
    assert len(calls) == 1  # the lowest layer did not run again
    hook.remove()
    full = policy.action_logprobs(**batch.rows(rows))
    mask = batch.action_mask[rows]
    torch.testing.assert_close(with_trunk[mask], full[mask], rtol=1e-5, atol=1e-5)
    assert not bool(with_trunk[~mask].any())
    (with_trunk * mask).sum().backward()  # the gradient reaches the layer above the trunk only
    assert policy.model.get_decoder().layers[1].self_attn.q_proj.weight.grad is not None
    assert len(policy.model.get_decoder().layers) == 2  # the model's own layer list is back


def _count_calls(module, calls: dict, key: str):
    def count(*_):
        calls[key] += 1

    return module.register_forward_hook(count)


@pytest.mark.parametrize("same_reference", [True, False])
def test_an_update_over_a_frozen_trunk_equals_the_update_that_runs_every_layer(same_reference):
    """With OPSM, an output split across micro-batches and a KL term: the gradient and metrics of the
    update from the trunk's states are those of the update that runs every layer. A reference with the
    same lowest layer starts from the policy's states too; one whose lowest layer differs runs its
    own."""
    import copy

    from dsv32.rl.grpo.config import GRPOConfig
    from dsv32.rl.grpo.policy import Policy
    from dsv32.rl.grpo.update import grpo_update

    policy = _frozen_trunk_policy()
    batch, advantages, ids = _split_outputs_batch(policy)
    ref = Policy(copy.deepcopy(policy.model).requires_grad_(False), policy.tokenizer, policy.kind)
    if not same_reference:
        with torch.no_grad():
            ref.model.get_decoder().layers[0].mlp.up_proj.weight.mul_(-3.0)
    policy_lowest, ref_lowest = (p.model.get_decoder().layers[0] for p in (policy, ref))
    cfg = GRPOConfig(prompts_per_step=1, group_size=3, clip_grad=1e9, opsm_delta=0.1, keep_routing=False,
                     mini_batches=1, micro_batch=2, kl_coef=0.5)  # fmt: skip
    out = {}
    for frozen_trunk in (False, True):
        calls = {"policy": 0, "ref": 0}
        hooks = [_count_calls(policy_lowest, calls, "policy"), _count_calls(ref_lowest, calls, "ref")]
        opt = GradientRecorder(policy.model.parameters())
        (record,) = grpo_update(
            policy, opt, batch, advantages, cfg, temperature=1.0, ref=ref,
            generator=torch.Generator().manual_seed(0), sequence_ids=ids, frozen_trunk=frozen_trunk,
        )  # fmt: skip
        for h in hooks:
            h.remove()
        out[frozen_trunk] = (opt.grads[0], record, calls)
    (g0, r0, c0), (g1, r1, c1) = out[False], out[True]
    torch.testing.assert_close(g1, g0, rtol=1e-4, atol=1e-7)
    for k in ("opsm_masked_frac", "pg_loss", "kl", "kl_loss", "log_ratio_sampling", "clip_frac", "ratio_max"):
        assert r1[k] == pytest.approx(r0[k], rel=1e-4, abs=1e-7), k
    assert r0["kl"] > 1e-4 if not same_reference else r0["kl"] == pytest.approx(0.0, abs=1e-6)
    assert c0["policy"] > 3 and c0["ref"] == 3  # every forward ran the lowest layer: 6 rows, 2 at a time
    assert c1["policy"] == 3  # with the trunk: once per row, in the trunk's own forwards
    assert c1["ref"] == (0 if same_reference else 3)
