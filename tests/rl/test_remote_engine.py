"""GRPO with a remote rollout engine (``dsv32 serve`` in another process): the same step as in
process, file weight sync with the served version checked, stale samples refused or OPSM-masked."""

from __future__ import annotations

import copy
import json

import pytest
import torch

pytest.importorskip("transformers")

from helpers.remote import serve_subprocess
from helpers.rl import LETTER_TASKS, LetterReward, jsonl_recipe
from helpers.tolerances import ON_POLICY

from dsv32.rl.engines import (
    CollectiveWeightSync,
    EngineError,
    FileWeightSync,
    InProcessEngine,
    RemoteEngine,
    StaleSampleError,
    check_staleness,
    prepare_engine,
)
from dsv32.rl.engines.base import turn_seed
from dsv32.rl.grpo.build import make_optimizer
from dsv32.rl.grpo.config import GRPOConfig
from dsv32.rl.grpo.policy import load_policy
from dsv32.rl.grpo.rollout import SamplingConfig, rollout
from dsv32.rl.grpo.single_turn import SingleTurnTrainer
from dsv32.rl.grpo.update import grpo_update


@pytest.fixture(scope="module")
def native_server():
    with serve_subprocess("tiny-native") as url:
        yield url


def _perturbed(name: str, seed: int, scale: float = 0.05):
    """A tiny policy whose weights differ from the ones ``dsv32 serve NAME`` starts with."""
    policy = load_policy(name, device="cpu")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.model.parameters():
            if p.is_floating_point():
                p.add_(torch.randn(p.shape, generator=g) * scale)
    return policy


def _recipe(tmp_path, **over):
    sets = [
        "policy.name=tiny-native",
        "grpo.prompts_per_step=4",
        "grpo.group_size=2",
        "grpo.mini_batches=2",
        "grpo.micro_batch=4",
        "grpo.lr=1e-2",
        "grpo.keep_routing=true",
        "sampling.max_new_tokens=6",
        "sampling.temperature=1.0",
        "sampling.top_p=0.9",
        "eval.problems=0",
    ]
    rows = [{"prompt": t.prompt, "domain": "toy"} for t in LETTER_TASKS]
    return jsonl_recipe(tmp_path, rows, [*sets, *[f"{k}={v}" for k, v in over.items()]])


def _two_steps(policy, cfg, engine):
    trainer = SingleTurnTrainer(cfg, policy=policy, reward_fn=LetterReward(), engine=engine, progress=False)
    records = [trainer.step(s) for s in range(2)]
    return records, policy.model.state_dict()


def test_a_grpo_step_with_dsv32_serve_as_engine_equals_the_in_process_step(native_server, tmp_path):
    cfg = _recipe(tmp_path)
    base = _perturbed("tiny-native", seed=1)
    local, remote_policy = copy.deepcopy(base), copy.deepcopy(base)
    ref_records, ref_state = _two_steps(local, cfg, InProcessEngine(local.model))
    engine = RemoteEngine(native_server, sync=FileWeightSync(tmp_path / "weights"))
    records, state = _two_steps(remote_policy, cfg, engine)

    assert engine.weight_version() == 1  # synced before each step's rollouts
    assert [r["staleness"] for r in records] == [[0] * 8, [0] * 8]
    assert [p.name for p in (tmp_path / "weights").iterdir()] == ["weights-v000001.safetensors"]
    for ref, got in zip(ref_records, records):
        # on-policy: the engine sampled with the trainer's weights
        assert got["first_update_abs_log_ratio"] <= ON_POLICY
        same = {k: v for k, v in ref.items() if isinstance(v, float) and not k.endswith("_s")}
        assert {k: got[k] for k in same} == pytest.approx(same, abs=1e-5)
    assert ref_records[0]["length_mean"] > 0
    # the same samples; the in-process engine runs the step's groups in one batched forward and
    # dsv32 serve one call per group, so the sampling log-probs (π_old) agree to fp32 rounding, which
    # two Adam steps at lr 1e-2 turn into weight differences of a few 1e-5
    diff = max(float((state[k] - ref_state[k]).abs().max()) for k in ref_state)
    assert diff <= 1e-4
    moved = max(float((ref_state[k] - base.model.state_dict()[k]).abs().max()) for k in ref_state)
    assert moved > 1e-3  # the two steps did update the policy


def test_the_remote_batch_carries_kept_sets_and_routing_as_in_process(native_server, tmp_path):
    policy = _perturbed("tiny-native", seed=2)
    engine = RemoteEngine(native_server, sync=FileWeightSync(tmp_path))
    engine.sync(policy.model, 7)
    tasks = LETTER_TASKS
    params = SamplingConfig(temperature=0.8, top_p=0.7, top_k=20, max_new_tokens=8)

    def batch(e):
        g = torch.Generator().manual_seed(5)
        return rollout(policy, tasks, 2, params, generator=g, keep_routing=True, engine=e)

    local, remote = batch(InProcessEngine(policy.model)), batch(engine)
    assert remote.weight_versions == [7] * 8
    assert torch.equal(local.sequences, remote.sequences)
    assert torch.equal(local.kept_ids, remote.kept_ids)
    assert torch.equal(remote.sampling_logprobs, local.sampling_logprobs)
    assert torch.equal(remote.routing, local.routing)  # padding columns included


def test_at_every_turn_a_group_samples_in_process_what_the_remote_engine_samples_for_it(
    native_server, tmp_path
):
    # a generator per group: the in-process engine's one batched call (rows of a group share their
    # generator) and one remote call per group draw the same tokens at a later turn as at the first
    policy = _perturbed("tiny-native", seed=3)
    engine = RemoteEngine(native_server, sync=FileWeightSync(tmp_path))
    engine.sync(policy.model, 1)
    prompts = [[5 + 3 * i, 6 + 3 * i, 7 + 3 * i] for i in range(4)]
    groups = [torch.Generator().manual_seed(11), torch.Generator().manual_seed(12)]
    kw = dict(max_new_tokens=6, temperature=0.8, top_p=0.7, top_k=20, eos=[], pad=policy.pad_token_id)
    kw |= dict(return_kept=False, return_routing=False)
    for turn in (0, 2):
        per_row = [groups[0], groups[0], groups[1], groups[1]]
        local = InProcessEngine(policy.model).generate(prompts, generator=per_row, turn=turn, **kw)
        for k, g in enumerate(groups):
            remote = engine.generate(prompts[2 * k : 2 * k + 2], generator=g, turn=turn, **kw)
            assert remote.tokens == local.tokens[2 * k : 2 * k + 2]
    assert local.tokens[0] != local.tokens[2]  # the two groups drew different noise


def test_a_stale_sample_is_refused_or_with_staleness_allowed_masked_by_opsm(native_server, tmp_path):
    old = _perturbed("tiny-native", seed=3)
    engine = RemoteEngine(native_server, sync=FileWeightSync(tmp_path))
    engine.sync(old.model, 0)
    policy = copy.deepcopy(old)  # the trainer one step later: its weights moved, the engine's did not
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    tasks = LETTER_TASKS
    params = SamplingConfig(temperature=1.0, max_new_tokens=6)
    batch = rollout(policy, tasks, 2, params, generator=torch.Generator().manual_seed(0), engine=engine)
    assert batch.weight_versions == [0] * 8

    with pytest.raises(StaleSampleError, match="1 step"):
        check_staleness(batch.weight_versions, 1, 0)
    assert check_staleness(batch.weight_versions, 1, 1) == [1] * 8
    assert prepare_engine(engine, policy.model, 1, 1) == 0.0  # allowed lag: no sync
    assert engine.weight_version() == 0

    # Eq. 9 by hand: M_i = 0 iff A_i < 0 and (1/|o_i|) Σ_t log(π_old / π_θ) > δ.
    with torch.no_grad():
        logp = policy.action_logprobs(**batch.rows(torch.arange(8)), temperature=1.0)
    m = batch.action_mask
    divergence = torch.where(m, batch.sampling_logprobs - logp, 0.0).sum(-1) / m.sum(-1)
    advantages = torch.tensor([-1.0, 1.0] * 4)
    negative = sorted(float(d) for d, a in zip(divergence, advantages) if a < 0)
    delta = (negative[1] + negative[2]) / 2  # two of the four negative outputs above δ
    expected = (advantages < 0) & (divergence > delta)
    assert int(expected.sum()) == 2
    cfg = GRPOConfig(mini_batches=1, micro_batch=8, opsm_delta=delta, keep_routing=False, lr=1e-3)
    optimizer = make_optimizer(policy, cfg)
    (record,) = grpo_update(
        policy, optimizer, batch, advantages, cfg, temperature=1.0, ref=None, generator=torch.Generator()
    )
    assert record["opsm_masked_frac"] == pytest.approx(float(expected.float().mean()))


def test_the_trainer_logs_staleness_when_the_recipe_allows_it(native_server, tmp_path):
    cfg = _recipe(tmp_path, **{"engine.max_off_policy_steps": 1, "grpo.opsm_delta": 0.5})
    policy = _perturbed("tiny-native", seed=5)
    engine = RemoteEngine(native_server, sync=FileWeightSync(tmp_path / "w"))
    records, _ = _two_steps(policy, cfg, engine)
    assert [r["staleness"] for r in records] == [[0] * 8, [1] * 8]  # step 2 sampled with version 0
    assert records[1]["staleness_max"] == 1 and engine.weight_version() == 0


def test_an_unreachable_engine_is_a_clear_error_at_connect_not_at_construction():
    from dsv32.serve import free_port

    engine = RemoteEngine(f"http://127.0.0.1:{free_port()}", timeout=5)  # sends nothing
    for first_use in (engine.connect, engine.weight_version):
        with pytest.raises(EngineError, match=r"GET http://127\.0\.0\.1:\d+/v1/models: .*refused"):
            first_use()


def test_engine_settings_are_checked_and_nccl_sync_needs_cuda(tmp_path):
    from dsv32.rl.engines import build_engine
    from dsv32.rl.grpo.config import RLConfigError, load_rl_config

    cfg = load_rl_config(None, ["engine.kind=remote", "engine.url=http://127.0.0.1:1", "engine.sync=nccl"])
    assert cfg.engine.url == "http://127.0.0.1:1"
    with pytest.raises(EngineError, match=r"nccl.*needs the trainer's weights on CUDA"):
        build_engine(cfg.engine, None, tmp_path)
    with pytest.raises(RLConfigError, match="needs url"):
        load_rl_config(None, ["engine.kind=remote"])
    with pytest.raises(RLConfigError, match="max_off_policy_steps"):
        load_rl_config(None, ["engine.max_off_policy_steps=-1"])
    assert isinstance(build_engine(load_rl_config(None, []).engine, object(), tmp_path), InProcessEngine)


def test_vllm_shaped_replies_are_read_versions_from_spans_routing_from_base64():
    import base64
    import io

    import numpy as np

    from dsv32.engine.wire import GenerateChoice
    from dsv32.rl.engines.remote import _choice_version, _output

    experts = np.arange(2 * 3 * 1, dtype=np.uint16).reshape(3, 2, 1)  # 2 prompt + 2 generated − 1 positions
    buf = io.BytesIO()
    np.save(buf, experts)
    choice = {
        "token_ids": [5, 6],
        "logprobs": {"content": [{"token_id": 5, "logprob": -0.5}, {"token_id": 6, "logprob": -1.5}]},
        "routed_experts": base64.b64encode(buf.getvalue()).decode(),
        "sampling_mask": None,
        "weight_versions": [{"version": "4", "start": 0, "end": 1}, {"version": "3", "start": 1, "end": 2}],
    }

    def typed(c: dict) -> GenerateChoice:
        return GenerateChoice.model_validate(c)

    assert _choice_version(typed(choice), None) == 3  # a row sampled across a sync: its oldest version
    spans = [{"version": "policy-a", "start": 0, "end": 2}]
    assert _choice_version(typed({"token_ids": [], "weight_versions": spans}), 7) is None
    assert _choice_version(typed({"token_ids": []}), "7") == 7
    out = _output([[1, 2, 3], [1, 2]], [typed(choice), typed(choice)], [3, 3], True, True, False)
    assert out.kept is None  # no sampling mask returned: none is made up
    assert out.logprobs == [[-0.5, -1.5], [-0.5, -1.5]] and out.weight_version == 3
    assert out.routing.shape == (2, 2, 4, 1)  # [layers, B, P + N − 1, k]
    assert (
        out.routing[:, 1, 1:4, 0].T.tolist() == experts[:, :, 0].tolist()
    )  # the shorter prompt is left-padded


# ------------------------------------------------------------------ the wire format, without a server
class FakeEngine:
    """Answers a :class:`RemoteEngine`'s client in place of a server, and keeps what was sent."""

    def __init__(self, generate_reply: dict | None = None) -> None:
        self.sent: list[tuple[str, str, dict | None]] = []
        self.generate_reply = generate_reply

    def __call__(self, method, path, body=None, timeout=None):
        if hasattr(body, "model_dump"):
            body = body.model_dump(exclude_unset=True)
        self.sent.append((method, path, body))
        if path == "/v1/models":
            return {"object": "list", "data": [{"id": "served", "object": "model"}]}
        if path == "/weight_info":
            return {"weight_version": 3, "path": None, "model": "served", "transfer": None}
        assert self.generate_reply is not None, f"nothing should reach {path}"
        return self.generate_reply


def _fake_remote(reply: dict | None, **kw) -> tuple[RemoteEngine, FakeEngine]:
    engine = RemoteEngine("http://127.0.0.1:1", **kw)
    engine.client.request = fake = FakeEngine(reply)
    return engine, fake


GEN = dict(max_new_tokens=3, temperature=0.7, top_p=0.9, top_k=0, eos=[2], pad=0, turn=1)
GEN |= dict(return_kept=True, return_routing=False)
REPLY = {
    "id": "gen-1",
    "object": "generate",
    "model": "served",
    "choices": [
        {
            "index": i,
            "token_ids": [5, 2],
            "logprobs": {"content": [{"token_id": 5, "logprob": -0.5}, {"token_id": 2, "logprob": -1.0}]},
            "finish_reason": "stop",
            "sampling_mask": [[5, 6], [2]],
            "routed_experts": None,
        }
        for i in range(2)
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 4},
    "weight_version": 3,
    "pad_token_id": 0,
}


def test_the_remote_engine_sends_the_wire_format_and_reads_the_reply_typed():
    engine, fake = _fake_remote(REPLY)
    g = torch.Generator().manual_seed(7)
    out = engine.generate([[1, 2], [3]], generator=g, **GEN)
    assert [p for _, p, _ in fake.sent] == ["/v1/models", "/inference/v1/generate"]
    sent = fake.sent[1][2]
    expected = {
        "model": "served",
        "token_ids": [[1, 2], [3]],
        "sampling_params": {
            "max_tokens": 3,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": -1,
            "stop_token_ids": [2],
            "logprobs": 0,
            "return_sampling_mask": True,
            "return_routed_experts": False,
            "seed": turn_seed(g, 1),
        },
        "stream": False,
        "pad_token_id": 0,
    }
    assert json.dumps(sent) == json.dumps(expected)  # key for key, in order
    assert out.tokens == [[5, 2], [5, 2]] and out.logprobs == [[-0.5, -1.0]] * 2
    assert out.kept[0].tolist() == [[5, 6], [2, -1]] and out.weight_version == 3
    vllm, fake = _fake_remote(REPLY, api="vllm", model="served")
    vllm.generate([[1, 2], [3]], generator=g, **GEN)
    bodies = [b for _, p, b in fake.sent if p == "/inference/v1/generate"]
    assert [b["token_ids"] for b in bodies] == [[1, 2], [3]] and all("pad_token_id" not in b for b in bodies)
    assert [b["sampling_params"]["seed"] for b in bodies] == [turn_seed(g, 1), turn_seed(g, 1) + 1]


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda r: r.pop("choices"), r"choices: Field required"),
        (
            lambda r: r["choices"][1]["token_ids"].__setitem__(1, "2"),
            r"choices\[1\]\.token_ids\[1\]: .*integer",
        ),
        (
            lambda r: r["choices"][0].update(logprobs={"content": [{"token_id": 5}]}),
            r"logprob: Field required",
        ),
        (lambda r: r["choices"][0].update(logprobs=None), "no sampling log-probs"),
        (lambda r: r["choices"][0].update(sampling_mask=[[5]]), "1 kept sets for 2 tokens"),
        (lambda r: r.update(weight_version=[3]), r"weight_version"),
        (lambda r: r["choices"].pop(), "1 choices for 2 prompts"),
    ],
)
def test_a_malformed_engine_reply_is_an_engine_error_naming_what_is_wrong(change, needle):
    reply = copy.deepcopy(REPLY)
    change(reply)
    engine, _ = _fake_remote(reply)
    with pytest.raises(EngineError, match=needle):
        engine.generate([[1, 2], [3]], generator=None, **GEN)


def test_malformed_routed_experts_are_an_engine_error():
    reply = copy.deepcopy(REPLY)
    for c in reply["choices"]:
        c["routed_experts"] = "not base64 npy"
    engine, _ = _fake_remote(reply)
    with pytest.raises(EngineError, match="routed_experts cannot be read"):
        engine.generate([[1, 2], [3]], generator=None, **(GEN | {"return_routing": True}))


def test_a_request_the_engine_would_refuse_is_an_engine_error_before_it_is_sent():
    engine, fake = _fake_remote(None)
    with pytest.raises(EngineError, match=r"sampling_params.*temperature|temperature.*2"):
        engine.generate([[1, 2]], generator=None, **(GEN | {"temperature": 3.0}))
    with pytest.raises(EngineError, match="prefix cache"):
        engine.generate([[1, 2]], generator=None, prefix=object(), **GEN)
    per_row = [torch.Generator().manual_seed(1), torch.Generator().manual_seed(2)]
    with pytest.raises(EngineError, match="split_calls"):
        engine.generate([[1, 2], [3]], generator=per_row, **GEN)
    assert [p for _, p, _ in fake.sent] == ["/v1/models"]


def test_every_engine_declares_the_protocols_capabilities_and_keywords():
    import inspect

    from dsv32.rl.engines import RolloutEngine, WeightSync, split_calls

    engines = [InProcessEngine(torch.nn.Linear(1, 1)), RemoteEngine("http://127.0.0.1:1")]
    protocol = list(inspect.signature(RolloutEngine.generate).parameters)[1:]  # without self
    for engine in engines:
        assert isinstance(engine.name, str) and isinstance(engine.shares_weights, bool)
        assert engine.synced is None
        for method in ("connect", "generate", "sync", "weight_version", "close"):
            assert callable(getattr(engine, method))
        assert list(inspect.signature(engine.generate).parameters) == protocol
    assert [e.shares_weights for e in engines] == [True, False]
    push = list(inspect.signature(WeightSync.push).parameters)[1:]
    for sync in (FileWeightSync("unused"), CollectiveWeightSync()):
        assert list(inspect.signature(sync.push).parameters) == push and isinstance(sync.name, str)
    # rows with their own generators: one call where the engine shares the trainer's model
    gens = [torch.Generator(), torch.Generator()]
    assert len(split_calls(engines[0], [0, 1], gens)) == 1
    assert len(split_calls(engines[1], [0, 1], gens)) == 2


def test_dsv32_rl_train_with_a_remote_engine_syncs_as_the_recipe_allows(native_server, tmp_path):
    from dsv32.rl.grpo.single_turn import train_grpo

    cfg = _recipe(
        tmp_path,
        **{
            "grpo.steps": 3,
            "engine.kind": "remote",
            "engine.url": native_server,
            "engine.max_off_policy_steps": 1,
        },
    )
    result = train_grpo(cfg, reward_fn=LetterReward(), progress=False)
    assert [r["staleness"] for r in result.metrics] == [[0] * 8, [1] * 8, [0] * 8]  # synced at steps 1 and 3
    assert [p.name for p in (tmp_path / "run" / "weights").iterdir()] == ["weights-v000002.safetensors"]
    assert RemoteEngine(native_server).weight_version() == 2


def test_a_new_run_syncs_even_when_the_engine_serves_its_version_number(native_server, tmp_path):
    other = _perturbed("tiny-native", seed=7)
    RemoteEngine(native_server, sync=FileWeightSync(tmp_path / "a")).sync(other.model, 0)  # another run's v0
    ours = _perturbed("tiny-native", seed=8)
    engine = RemoteEngine(native_server, sync=FileWeightSync(tmp_path / "b"))
    assert prepare_engine(engine, ours.model, 0, 5) > 0  # same number, not our weights: pushed again
    assert prepare_engine(engine, ours.model, 0, 5) == 0.0  # now ours


# ------------------------------------------------------------------ collective weight sync (gloo here)
def _sample(policy, engine):
    tasks = LETTER_TASKS
    params = SamplingConfig(temperature=1.0, top_p=0.9, max_new_tokens=6)
    g = torch.Generator().manual_seed(9)
    return rollout(policy, tasks, 2, params, generator=g, keep_routing=True, engine=engine)


def _same_samples(a, b):
    assert torch.equal(a.sequences, b.sequences)
    assert torch.equal(a.sampling_logprobs, b.sampling_logprobs)


def test_a_collective_sync_gives_the_engine_the_trainers_weights(native_server, tmp_path):
    policy = _perturbed("tiny-native", seed=11)
    sync = CollectiveWeightSync(timeout=20)
    engine = RemoteEngine(native_server, sync=sync)
    assert engine.sync(policy.model, 4) > 0
    info = engine.client.request("GET", "/weight_info")
    assert info["weight_version"] == 4 and info["transfer"] == {
        "backend": "gloo",
        "receiving": False,
        "error": None,
    }
    _same_samples(_sample(policy, InProcessEngine(policy.model)), _sample(policy, engine))
    assert _sample(policy, engine).weight_versions == [4] * 8
    # a second sync over the same group: the new weights, the new version
    with torch.no_grad():
        for p in policy.model.parameters():
            p.mul_(0.9)
    engine.sync(policy.model, 5)
    assert engine.weight_version() == 5
    _same_samples(_sample(policy, InProcessEngine(policy.model)), _sample(policy, engine))


def test_a_collective_sync_with_the_wrong_tensors_is_refused_and_the_weights_kept(native_server):
    from dsv32.engine.weight_transfer import tensor_specs

    policy = _perturbed("tiny-native", seed=12)
    engine = RemoteEngine(native_server, sync=CollectiveWeightSync(timeout=20))
    engine.sync(policy.model, 2)
    before = _sample(policy, engine)
    specs = tensor_specs(policy.model.state_dict())
    name = specs["names"][0]
    bad = dict(specs, shapes=[[s[0] + 1, *s[1:]] if i == 0 else s for i, s in enumerate(specs["shapes"])])
    with pytest.raises(EngineError, match=rf"HTTP 400.*{name}: shape"):
        engine.client.request("POST", "/update_weights", {"weight_version": 3, **bad})
    missing = {k: v[1:] for k, v in specs.items()}
    with pytest.raises(EngineError, match=rf"HTTP 400.*missing \['{name}'\]"):
        engine.client.request("POST", "/update_weights", {"weight_version": 3, **missing})
    assert engine.weight_version() == 2
    _same_samples(before, _sample(policy, engine))


def test_a_transfer_whose_sender_is_gone_times_out_keeping_the_weights(native_server):
    import time

    from dsv32.engine.weight_transfer import tensor_specs

    policy = _perturbed("tiny-native", seed=13)
    engine = RemoteEngine(native_server, sync=CollectiveWeightSync(timeout=2))
    engine.sync(policy.model, 6)
    before = _sample(policy, engine)
    # announced, then never sent: the engine's receive gives up after the group's timeout
    engine.client.request(
        "POST", "/update_weights", {"weight_version": 7, **tensor_specs(policy.model.state_dict())}
    )
    t = time.monotonic()
    while (info := engine.client.request("GET", "/weight_info"))["transfer"]["receiving"]:
        assert time.monotonic() - t < 15
        time.sleep(0.1)
    assert "Timed out" in info["transfer"]["error"] and info["weight_version"] == 6
    assert info["transfer"]["backend"] is None  # the group is closed
    _same_samples(before, _sample(policy, engine))
    with pytest.raises(EngineError, match="no weight transfer group"):
        engine.client.request(
            "POST", "/update_weights", {"weight_version": 7, **tensor_specs(policy.model.state_dict())}
        )
    engine.weight_sync.group = None  # the trainer's end forms a new group on its next sync
    engine.sync(policy.model, 7)
    assert engine.weight_version() == 7


def test_a_collective_sync_to_an_engine_that_is_gone_fails_within_its_timeout():
    import time

    from dsv32.engine.weight_transfer import TransferError, send, tensor_specs

    policy = _perturbed("tiny-native", seed=14)
    sync = CollectiveWeightSync(timeout=3)
    state = policy.model.state_dict()
    with serve_subprocess("tiny-native") as url:
        engine = RemoteEngine(url, sync=sync)
        engine.sync(policy.model, 0)
        engine.client.request("POST", "/update_weights", {"weight_version": 1, **tensor_specs(state)})
    t = time.monotonic()  # the engine accepted the transfer, then its process ended
    with pytest.raises(TransferError, match="sending"):
        send(sync.group, state, 3)
    with pytest.raises(EngineError):
        engine.sync(policy.model, 1)
    assert time.monotonic() - t < 10


def test_the_recipe_chooses_the_collective_sync_and_nccl_needs_cuda(tmp_path):
    from dsv32.rl.engines.weight_sync import weight_sync
    from dsv32.rl.grpo.config import load_rl_config

    cfg = load_rl_config(
        None, ["engine.kind=remote", "engine.url=http://127.0.0.1:1", "engine.sync=collective"]
    )
    assert isinstance(weight_sync(cfg.engine.sync, tmp_path), CollectiveWeightSync)
    with pytest.raises(EngineError, match=r"nccl.*needs the trainer's weights on CUDA"):
        weight_sync("nccl", tmp_path, device="cpu")
    # no server needed: refused before any request
    vllm = RemoteEngine("http://127.0.0.1:1", api="vllm", sync=CollectiveWeightSync())
    with pytest.raises(EngineError, match="speaks dsv32 serve"):
        vllm.sync(torch.nn.Linear(1, 1), 0)


def test_the_remote_engine_returns_the_selections_recorded_in_process(native_server, tmp_path):
    # Keep Indexing over the wire: the indexer's selections of every position, base64 int32 per choice
    policy = _perturbed("tiny-native", seed=2)
    engine = RemoteEngine(native_server, sync=FileWeightSync(tmp_path))
    engine.sync(policy.model, 3)
    params = SamplingConfig(temperature=0.8, top_p=0.7, top_k=20, max_new_tokens=8)

    def batch(e):
        g = torch.Generator().manual_seed(5)
        return rollout(policy, LETTER_TASKS, 2, params, generator=g, keep_indexing=True, engine=e)

    local, remote = batch(InProcessEngine(policy.model)), batch(engine)
    assert torch.equal(local.sequences, remote.sequences)
    assert local.indexing is not None and local.indexing.dtype == torch.int32
    assert torch.equal(remote.indexing, local.indexing)
