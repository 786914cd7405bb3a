"""Ecosystem interop: OpenEnv and verifiers reference episodes, and a GRPO update with a LoRA adapter
against full fine-tuning.

- ``openenv_reference_reward``: ``dsv32 envs serve code-interpreter`` started as a subprocess on
  127.0.0.1, the code interpreter's reference episode played through openenv-core's own
  ``GenericEnvClient`` (its tool calls, then its final answer); ``openenv_wrong_reward`` the same
  episode ending in a wrong answer.
- ``openenv_adapter_reward``: an arithmetic environment written with openenv-core's ``Environment``
  and ``create_fastapi_app`` (served on 127.0.0.1) played inside dsv32's agent loop through
  :class:`dsv32.interop.openenv.OpenEnvEnvironment` (the right sum, then a wrong one).
- ``verifiers_reference_reward``: the ``dsv32-envs`` taskset loaded by verifiers' own loader, its
  rubric (``Task.score``) on the code interpreter's reference trace (and on a wrong one).
- ``lora_update_speedup`` / ``lora_peak_memory_ratio``: one GRPO update of SmolLM2-135M-Instruct (fp32)
  with the agentic proof recipe's settings (configs/posttrain-agentic-smollm2.toml: the embeddings, tied
  to the head, and the lowest 22 of 30 layers frozen, the frozen trunk run once per row, KL toward
  the starting model with β = 0.2, OPSM δ = 0.5, 2 mini-batches, micro-batches of 8, temperature
  0.8) on ``--rows`` rows shaped like the recipe's episodes (``rl_frozen_trunk.episode_rows``),
  full fine-tuning of the 8 trained layers against a LoRA adapter (``--rank``, α = 2·rank) on every
  linear layer of the same 8 layers. Peak memory: each side in a subprocess of its own, the peak
  resident memory of the process during one update (``VmHWM`` after resetting it, so the model's
  loading does not count; the full side's frozen reference copy and AdamW state, the LoRA side's
  reference as the base model with the adapter switched off, both included); the workers run with
  glibc's mmap threshold fixed at 128 KiB, so a freed tensor's memory leaves the resident set and the
  peak follows the live tensors. Seconds: both sides in this process, one warm-up update each, then
  ``--reps`` blocks of (full, LoRA) with others' share of the CPU recorded
  (``benchmarks/_timing.py``). AdamW runs at lr 0, so every update sees the same weights.
  ``--all-layers`` adds the same comparison with every layer trained (full) and adapted (LoRA).
- ``lora_onpolicy_max_abs_log_ratio``: a LoRA policy (the same adapter, its ``lora_B`` drawn
  non-zero) samples prompts with the in-process engine at the recipe's temperature and top-p; the
  max over every sampled token of |training forward's log-prob − sampling log-prob| (with the
  recorded kept sets, from the frozen trunk's states as the update computes them).

    python benchmarks/interop.py [--rows 8] [--reps 2] [--rank 16] [--all-layers] [--quick] [--json]

Writes runs/bench/interop.json (``--out``); with ``--json`` the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _timing import add_max_wait  # noqa: E402 (beside this script)

FROZEN = 22
KEYS = (
    "openenv_reference_reward",
    "openenv_adapter_reward",
    "verifiers_reference_reward",
    "lora_update_speedup",
    "lora_peak_memory_ratio",
    "lora_onpolicy_max_abs_log_ratio",
)


# ------------------------------------------------------------------------------------ OpenEnv, verifiers
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reference():
    from dsv32.envs import get_env, replay, resolve_tasks

    task = resolve_tasks("code-interpreter", "smoke")[0]
    env = get_env("code-interpreter").factory()
    try:
        replies = env.reference(task)
        native = replay(env, task, replies)
        value = env.reward(native).value
    finally:
        env.close()
    return task, replies, native, value


def openenv_reference(task, replies) -> dict:
    """The reference episode through openenv-core's client against ``dsv32 envs serve``."""
    import httpx
    from openenv.core import GenericEnvClient

    port = _free_port()
    exe = Path(sys.executable).with_name("dsv32")
    cmd = [str(exe) if exe.exists() else sys.executable, *([] if exe.exists() else ["-m", "dsv32"])]
    cmd += ["envs", "serve", "code-interpreter", "--tasks", "smoke", "--port", str(port)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dsv32 envs serve did not start: {server.stderr.read()[-2000:]}")
            time.sleep(0.3)

        def play(client, final: str):
            client.reset(task_id=task.id)
            for reply in replies[:-1]:
                for call in reply["tool_calls"]:
                    f = call["function"]
                    client.step({"type": "call_tool", "tool_name": f["name"], "arguments": f["arguments"]})
            return client.step({"type": "final_answer", "content": final})

        with GenericEnvClient(base_url=url).sync() as client:
            right = play(client, replies[-1]["content"])
            wrong = play(client, "The answer is \\boxed{7}.")
        return {
            "openenv_reference_reward": right.reward,
            "openenv_reference_done": right.done,
            "openenv_wrong_reward": wrong.reward,
        }
    finally:
        server.terminate()
        server.wait(30)


def openenv_adapter() -> dict:
    """An openenv-core server's episode inside dsv32's agent loop (the right answer, then a wrong one)."""
    import random
    from typing import Any

    from openenv.core.env_server import create_fastapi_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    from dsv32.agent import ScriptedBackend, run_episode
    from dsv32.envs import tool_call
    from dsv32.interop.openenv import OpenEnvEnvironment, ServerThread, openenv_tasks

    def question(seed):
        rng = random.Random(seed)
        return rng.randint(100, 999), rng.randint(100, 999)

    class SumAction(Action):
        """Answer the question with a number."""

        answer: str

    class SumObservation(Observation):
        question: str = ""
        feedback: str = ""

    class SumEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._state, self.total = State(), None

        def reset(self, seed=None, episode_id=None, **kwargs: Any) -> SumObservation:
            a, b = question(seed)
            self.total, self._state = a + b, State(episode_id=episode_id)
            return SumObservation(question=f"What is {a} + {b}?")

        def step(self, action: SumAction, timeout_s=None, **kwargs: Any) -> SumObservation:
            self._state.step_count += 1
            ok = action.answer.strip() == str(self.total)
            return SumObservation(feedback="correct" if ok else "wrong", done=True, reward=float(ok))

        @property
        def state(self) -> State:
            return self._state

    app = create_fastapi_app(SumEnvironment, SumAction, SumObservation, max_concurrent_envs=2)
    task = openenv_tasks([{"seed": 3}])[0]
    rewards = []
    with ServerThread(app) as server:
        for answer in (str(sum(question(3))), "0"):
            env = OpenEnvEnvironment(server.url)
            replies = [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [tool_call("sum_action", {"answer": answer}, "c1")],
                },
                {"role": "assistant", "content": f"The sum is {answer}."},
            ]
            try:
                _, reward = run_episode(ScriptedBackend(replies), env, task)
            finally:
                env.close()
            rewards.append(reward.value)
    return {"openenv_adapter_reward": rewards[0], "openenv_adapter_wrong_reward": rewards[1]}


def verifiers_reference(native) -> dict:
    """verifiers' loader and rubric on the reference trace and a wrong one."""
    import asyncio

    import verifiers.v1 as vf

    from dsv32.interop.verifiers import trace_of

    env = vf.load_environment(
        vf.resolve_env_config({"taskset": {"id": "dsv32-envs", "env": "code-interpreter", "split": "smoke"}})
    )
    task = next(iter(env.taskset.take(1)))
    right = trace_of(task, native.messages, native.final)
    asyncio.run(task.score(right))
    messages = [*native.messages[:-1], {"role": "assistant", "content": "The answer is \\boxed{12}."}]
    wrong = trace_of(task, messages, messages[-1]["content"])
    asyncio.run(task.score(wrong))
    return {"verifiers_reference_reward": right.reward, "verifiers_wrong_reward": wrong.reward}


# ------------------------------------------------------------------------------------ LoRA against full
def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _setup(side: str, layers: str, rank: int):
    """The policy of one side: SmolLM2 with the recipe's frozen embeddings and layers, then full
    fine-tuning of the rest or a LoRA adapter on their linear layers."""
    from dsv32.engine import lora
    from dsv32.rl.grpo.policy import load_policy
    from dsv32.train.sft.model import freeze_lower_layers, vocab_matrices

    policy = load_policy("smollm2", device="cpu")
    frozen = FROZEN if layers == "recipe" else 0
    if side == "full":
        freeze_lower_layers(policy.model, frozen)
        for p in vocab_matrices(policy.model):
            p.requires_grad_(False)
    else:
        names = [
            n for n in lora.target_names(policy.model, lora.LoRAConfig()) if int(n.split(".")[2]) >= frozen
        ]
        cfg = lora.LoRAConfig(enabled=True, r=rank, alpha=2.0 * rank, target_modules=names)
        lora.apply_lora(policy.model, cfg, seed=0)
    return policy


def _update_batch(policy, rows: int):
    import torch
    from rl_frozen_trunk import episode_rows  # beside this script

    from dsv32.rl.agentic.episodes import rows_to_rollouts
    from dsv32.rl.grpo.tasks import Task

    g = torch.Generator().manual_seed(0)
    rs = episode_rows(rows, policy.model.config.vocab_size, g)
    tasks = [Task(id=f"t{i}", domain="toy", prompt="p") for i in range(rows)]
    batch = rows_to_rollouts(rs, tasks, policy.pad_token_id, "cpu", with_kept=False)
    with torch.no_grad():
        full = policy.action_logprobs(**batch.rows(torch.arange(rows)))
    noise = 0.05 * torch.randn(full.shape, generator=g)
    batch.sampling_logprobs = torch.where(batch.action_mask, full + noise, 0.0)
    return batch, torch.randn(rows, generator=g).sign()


def _side(side: str, layers: str, rows: int, rank: int):
    """One side ready to update: ``(update, policy, trained parameters)``."""
    import torch

    from dsv32.rl.grpo.build import reference_policy
    from dsv32.rl.grpo.config import GRPOConfig
    from dsv32.rl.grpo.update import grpo_update

    policy = _setup(side, layers, rank)
    cfg = GRPOConfig(prompts_per_step=max(1, rows // 4), group_size=4, mini_batches=2, micro_batch=8,
                     kl_coef=0.2, opsm_delta=0.5, keep_routing=False)  # fmt: skip
    ref = reference_policy(policy, cfg)
    batch, advantages = _update_batch(policy, rows)
    trained = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=0.0)

    def update() -> list[dict]:
        return grpo_update(policy, optimizer, batch, advantages, cfg, temperature=0.8, ref=ref,
                           generator=torch.Generator().manual_seed(0))  # fmt: skip

    return update, policy, trained, batch


def worker(side: str, layers: str, rows: int, rank: int) -> dict:
    """One side in this process: the peak resident memory of its first update."""
    import torch

    update, policy, trained, batch = _side(side, layers, rows, rank)
    before = _rss_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the current RSS
    t = time.perf_counter()
    update()
    seconds = time.perf_counter() - t
    return {
        "side": side,
        "layers": layers,
        "trained_parameters": sum(p.numel() for p in trained),
        "frozen_trunk": policy.frozen_trunk(),
        "rss_before_mb": before / 1024,
        "peak_rss_mb": _rss_kb("VmHWM") / 1024,
        "first_update_s": seconds,
        "tokens": int(batch.attention_mask.sum()),
        "threads": torch.get_num_threads(),
    }


def timing(args, layers: str) -> dict:
    """Both sides in this process, their updates interleaved (one warm-up each, then ``--reps``
    blocks of full, LoRA), with others' share of the CPU meanwhile (``benchmarks/_timing.py``)."""
    from _timing import Meter, interleaved, spread, wait_budget  # beside this script

    sides = {side: _side(side, layers, args.rows, args.rank)[0] for side in ("full", "lora")}
    meter = Meter(max_wait=wait_budget(args))
    runs = interleaved(sides, args.reps, meter)
    return {
        "full_update_s": spread(runs.seconds["full"]),
        "lora_update_s": spread(runs.seconds["lora"]),
        "speedup": runs.median("full") / runs.median("lora"),
        "contention": runs.contention(),
        **meter.facts(),
    }


def onpolicy(rank: int, prompts: int, max_new_tokens: int = 48) -> dict:
    """Sampling log-probs of a LoRA policy (in-process engine) against its training forward's."""
    import torch

    from dsv32.engine import lora
    from dsv32.rl.grpo.rollout import SamplingConfig, rollout
    from dsv32.rl.grpo.tasks import Task

    policy = _setup("lora", "recipe", rank)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if lora.is_adapter_parameter(n) and "lora_B" in n:
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
    questions = ["What is 17 * 23?", "Name a prime above 100.", "Reverse the digits of 48213.",
                 "What is 2**20?", "Sum the digits of 987654.", "What is 1001 mod 7?"]  # fmt: skip
    tasks = [Task(id=f"q{i}", domain="toy", prompt=questions[i % len(questions)]) for i in range(prompts)]
    sampling = SamplingConfig(
        temperature=0.8, top_p=0.95, max_new_tokens=max_new_tokens, max_total_tokens=400
    )
    batch = rollout(policy, tasks, 2, sampling, generator=torch.Generator().manual_seed(2))
    rows = torch.arange(len(batch))
    depth = policy.frozen_trunk()
    with torch.no_grad():
        plain = policy.action_logprobs(**batch.rows(rows), temperature=0.8)
        states = policy.trunk_states(batch.sequences, batch.attention_mask, batch.start, depth)
        from_trunk = policy.action_logprobs(**batch.rows(rows), temperature=0.8, trunk=(states, depth))
    mask = batch.action_mask.bool()
    diffs = [(lp - batch.sampling_logprobs)[mask].abs() for lp in (plain, from_trunk)]
    return {
        "lora_onpolicy_max_abs_log_ratio": float(max(d.max() for d in diffs)),
        "lora_onpolicy_mean_abs_log_ratio": float(diffs[1].mean()),
        "lora_onpolicy_tokens": int(mask.sum()),
    }


def _run_worker(args, side: str, layers: str) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", side, "--layers", layers,
           "--rows", str(args.rows), "--rank", str(args.rank)]  # fmt: skip
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    )
    # glibc's malloc: every block of 128 KiB or more its own mapping, returned to the kernel when freed
    # (no threshold that moves with the frees), so the resident peak follows the live tensors
    env |= {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{side} worker failed: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(args, layers: str) -> dict:
    """Peak memory: one subprocess per side. Seconds: both sides interleaved in this process."""
    memory = {side: _run_worker(args, side, layers) for side in ("full", "lora")}
    for side, m in memory.items():
        print(f"{layers} {side}: {json.dumps(m)}", file=sys.stderr, flush=True)
    seconds = timing(args, layers)
    full, lora = memory["full"], memory["lora"]
    return {
        "speedup": seconds["speedup"],
        "peak_memory_ratio": lora["peak_rss_mb"] / full["peak_rss_mb"],
        "peak_above_start_ratio": (lora["peak_rss_mb"] - lora["rss_before_mb"])
        / (full["peak_rss_mb"] - full["rss_before_mb"]),
        "memory": memory,
        "seconds": seconds,
    }


def load_average() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=8, help="rows of the GRPO update (default 8)")
    ap.add_argument("--reps", type=int, default=2, help="timed updates per side, interleaved (default 2)")
    ap.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 rank)")
    ap.add_argument("--all-layers", action="store_true", help="also every layer trained / adapted")
    ap.add_argument("--quick", action="store_true", help="4 rows, one subprocess per side, 2 short samples")
    ap.add_argument("--json", action="store_true", help="the last line printed is one JSON object")
    ap.add_argument("--out", default="runs/bench")
    add_max_wait(ap)
    ap.add_argument("--worker", choices=("full", "lora"), help=argparse.SUPPRESS)
    ap.add_argument("--layers", default="recipe", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.worker:
        print(json.dumps(worker(args.worker, args.layers, args.rows, args.rank)))
        return
    if args.quick:
        args.rows, args.reps = 4, 1
    result: dict = {
        "load_average_start": load_average(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    task, replies, native, value = _reference()
    result["native_reference_reward"] = value
    result |= openenv_reference(task, replies)
    result |= openenv_adapter()
    result |= verifiers_reference(native)
    recipe = compare(args, "recipe")
    result |= {
        "lora_update_speedup": recipe["speedup"],
        "lora_peak_memory_ratio": recipe["peak_memory_ratio"],
        "lora_peak_above_start_ratio": recipe["peak_above_start_ratio"],
        "lora_recipe": recipe,
    }
    if args.all_layers:
        every = compare(args, "all")
        result |= {
            "lora_all_layers_update_speedup": every["speedup"],
            "lora_all_layers_peak_memory_ratio": every["peak_memory_ratio"],
            "lora_all_layers": every,
        }
    result |= onpolicy(args.rank, *((2, 16) if args.quick else (6, 48)))
    result |= {"model": "SmolLM2-135M-Instruct", "dtype": "float32", "rows": args.rows, "reps": args.reps,
               "rank": args.rank, "frozen_layers": FROZEN, "load_average_end": load_average()}  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "interop.json").write_text(json.dumps(result, indent=2))
    head = {k: result[k] for k in KEYS}
    head |= {k: result[k] for k in result if k.endswith("wrong_reward")}
    head |= {k: result[k] for k in ("lora_peak_above_start_ratio", "load_average_start", "load_average_end")}
    if args.all_layers:
        head |= {
            k: result[k] for k in ("lora_all_layers_update_speedup", "lora_all_layers_peak_memory_ratio")
        }
    print(json.dumps(head) if args.json else json.dumps(head, indent=1))


if __name__ == "__main__":
    main()
