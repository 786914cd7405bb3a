"""Rollouts at scale: a remote engine with file weight sync, and environment episodes on Ray.

    python benchmarks/rollout_scale.py           # ~3 minutes on 2 cores; writes runs/bench/rollout_scale.json
    python benchmarks/rollout_scale.py --json    # the same, and only the JSON line on stdout
    python benchmarks/rollout_scale.py --quick   # 8 episodes instead of 16

- ``remote_onpolicy_max_abs_log_ratio``: SmolLM2 as the policy, ``dsv32 serve smollm2
  --enable-rl-routes`` in another process as its engine. One GRPO step (sync, rollouts, update), then the weights are synced again
  and the next batch is sampled by the server: max over its tokens of |log π_θ − log π_sampling|,
  π_θ from the trainer (the kept sets applied), i.e. the ratio of the first update after a sync;
- ``weight_sync_seconds``: that sync (write the safetensors, ``/update_weights``, version check);
- ``weight_sync_max_abs_diff``: the same weights synced into a ``dsv32 serve`` application on a
  thread of this process, where its model can be read: max |engine − trainer| over every
  ``state_dict()`` key (the tied LM head included); ``tied_head_kept``: the head still is the embedding;
- ``collective_sync_seconds`` / ``collective_sync_max_abs_diff``: the next weights (every tensor
  scaled by 1.001) pushed into that application over a gloo group (``sync = "collective"``: join
  once, then announce, broadcast all ``state_dict()`` tensors, the version confirmed), and the same
  difference after it (the group's set-up, ``collective_connect_seconds``, not in the sync time);
- ``ray_episode_speedup``: 16 code-interpreter episodes (reference solutions, every tool call in
  the sandbox) one after another in this process, against 4 Ray actors of 0.5 CPU each on a local
  cluster (its start-up and the actors' one-time costs, ``ray_startup_seconds``, not counted: imports, the
  sandbox probe, the math-verify worker; this process pays the same before its serial episodes); the rewards of both must agree;
- ``leftover_processes``: processes of the Ray cluster and of the server still running once both
  were shut down.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

OUT = Path("runs/bench")


def start_server(model: str) -> tuple[subprocess.Popen, str]:
    from dsv32.serve import free_port, wait_until_up
    from dsv32.serve.server import ServerError

    port = free_port()
    cmd = [sys.executable, "-c", "import sys; from dsv32.cli import main; sys.exit(main())", "serve", model,
           "--port", str(port), "--device", "cpu", "--threads", str(torch.get_num_threads()),
           "--enable-rl-routes"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, proc, timeout=300)
    except ServerError:
        proc.kill()
        raise
    return proc, url


def remote_engine(tmp: Path) -> dict:
    from dsv32.rl.engines import CollectiveWeightSync, FileWeightSync, RemoteEngine
    from dsv32.rl.grpo.build import step_generator
    from dsv32.rl.grpo.config import load_rl_config
    from dsv32.rl.grpo.policy import load_policy
    from dsv32.rl.grpo.rewards import RewardResult
    from dsv32.rl.grpo.rollout import rollout
    from dsv32.rl.grpo.single_turn import SingleTurnTrainer
    from dsv32.serve import ServerThread, create_app, load_served

    class Letters:  # a reward with spread: the share of ASCII letters in the completion
        def score_many(self, samples, max_workers=1):
            share = [sum(c.isalpha() for c in s.completion) / max(1, len(s.completion)) for s in samples]
            return [RewardResult(total=v, components={"letters": v}, correct=v > 0.5) for v in share]

    prompts = ["Name a fruit.", "Count to three.", "Say hello.", "What is 2 + 2?"]
    (tmp / "tasks.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    cfg = load_rl_config(None, [f"out_dir={tmp / 'run'}", "policy.name=smollm2", "grpo.prompts_per_step=4",
                                "grpo.group_size=2", "grpo.keep_routing=false", "grpo.mini_batches=1", "grpo.micro_batch=8", "grpo.lr=1e-5",
                                "sampling.max_new_tokens=16", "sampling.top_p=0.95", "eval.problems=0"])  # fmt: skip
    cfg.sources[0].kind, cfg.sources[0].path, cfg.sources[0].domain = "jsonl", str(tmp / "tasks.jsonl"), "toy"
    policy = load_policy("smollm2", device="cpu")
    proc, url = start_server("smollm2")
    try:
        engine = RemoteEngine(url, sync=FileWeightSync(tmp / "weights"))
        trainer = SingleTurnTrainer(cfg, policy=policy, reward_fn=Letters(), engine=engine, progress=False)
        mix = trainer.tasks
        trainer.step(0)
        sync_s = engine.sync(policy.model, 1)  # the weights after the update
        policy.model.eval()
        with torch.no_grad():
            batch = rollout(
                policy, mix.sample(1, 4), 2, cfg.sampling, generator=step_generator(0, 1, 1), engine=engine
            )
            logp = policy.action_logprobs(**batch.rows(torch.arange(len(batch))), temperature=1.0)
        ratio = float((logp - batch.sampling_logprobs)[batch.action_mask].abs().max())
        versions = sorted(set(batch.weight_versions))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    served = load_served("smollm2", device="cpu")
    with ServerThread(create_app(served, rl_routes=True)) as server:
        RemoteEngine(server.base_url, sync=FileWeightSync(tmp / "weights2")).sync(policy.model, 1)
        theirs, ours = served.model.state_dict(), policy.model.state_dict()
        diff = max(float((theirs[k] - ours[k]).abs().max()) for k in ours)
        tied = served.model.lm_head.weight.data_ptr() == served.model.model.embed_tokens.weight.data_ptr()
        collective = CollectiveWeightSync(timeout=120)
        engine = RemoteEngine(server.base_url, sync=collective)
        t = time.perf_counter()
        collective.connect(engine.client, "cpu")
        connect_s = time.perf_counter() - t
        with torch.no_grad():
            for p in policy.model.parameters():
                p.mul_(1.001)
        collective_s = engine.sync(policy.model, 2)
        theirs, ours = served.model.state_dict(), policy.model.state_dict()
        collective_diff = max(float((theirs[k] - ours[k]).abs().max()) for k in ours)
        tied = (
            tied
            and served.model.lm_head.weight.data_ptr() == served.model.model.embed_tokens.weight.data_ptr()
        )
    return {
        "remote_onpolicy_max_abs_log_ratio": ratio,
        "remote_onpolicy_tokens": int(batch.action_mask.sum()),
        "remote_weight_versions": versions,
        "weight_sync_seconds": round(sync_s, 3),
        "weight_sync_max_abs_diff": diff,
        "weight_sync_keys": len(ours),
        "tied_head_kept": tied,
        "collective_connect_seconds": round(connect_s, 3),
        "collective_sync_seconds": round(collective_s, 3),
        "collective_sync_max_abs_diff": collective_diff,
        "server_exit_code": proc.returncode,
    }


def _warm(_) -> int:
    """What a process's first episode would otherwise pay once: importing the agent, the environment
    and its kernel client, probing the sandbox's isolation, and starting the math-verify worker that
    checks answers off the main thread. Run the way episodes run (on a worker thread here, in the
    actor on Ray) before either side is timed, so neither side's timing holds it."""
    from dsv32.agent import run_episode  # noqa: F401
    from dsv32.envs import get_env, sandbox
    from dsv32.envs.interpreter import kernel  # noqa: F401  (jupyter_client, zmq)
    from dsv32.envs.mathcheck import answers_equal

    get_env("code-interpreter")
    sandbox.isolation()
    if not answers_equal("\\frac{1}{2}", "0.5"):
        raise RuntimeError("math-verify did not find 1/2 equal to 0.5")
    return os.getpid()


def ray_episodes(n: int) -> dict:
    from dsv32.envs import resolve_tasks
    from dsv32.rl.agentic.fanout import (
        RayRunner,
        ThreadRunner,
        ray_processes,
        reference_backend,
        run_env_episodes,
    )
    from dsv32.rl.grpo.config import RayConfig

    tasks = (resolve_tasks("code-interpreter", "heldout") * 2)[:n]
    serial_runner = ThreadRunner(1)
    serial_runner.map(_warm, [None])
    t = time.perf_counter()
    serial = run_env_episodes(serial_runner, "code-interpreter", tasks, reference_backend)
    serial_s = time.perf_counter() - t
    t = time.perf_counter()
    runner = RayRunner(RayConfig(address="local", num_cpus=os.cpu_count() or 2, actors=4, cpus_per_actor=0.5))
    runner.map(_warm, range(4))
    startup_s = time.perf_counter() - t
    try:
        t = time.perf_counter()
        on_ray = run_env_episodes(runner, "code-interpreter", tasks, reference_backend)
        ray_s = time.perf_counter() - t
        started = ray_processes()
    finally:
        runner.close()
    rewards = [r["reward"] for r in serial]
    if rewards != [r["reward"] for r in on_ray]:
        raise RuntimeError("the Ray episodes' rewards differ from the serial ones")
    return {
        "episodes": n,
        "serial_seconds": round(serial_s, 2),
        "ray_seconds": round(ray_s, 2),
        "ray_startup_seconds": round(startup_s, 2),
        "ray_episode_speedup": round(serial_s / ray_s, 2),
        "mean_reward": sum(rewards) / len(rewards),
        "ray_actor_pids": len({r["pid"] for r in on_ray}),
        "_started": started,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print only the result as one JSON line")
    ap.add_argument("--quick", action="store_true", help="8 episodes instead of 16")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    from dsv32.rl.agentic.fanout import still_running

    with tempfile.TemporaryDirectory(prefix="dsv32-rollout-scale-") as tmp:
        result = remote_engine(Path(tmp))
    result |= ray_episodes(8 if args.quick else 16)
    started = result.pop("_started")
    result["leftover_processes"] = len(still_running(started)) + int(result.pop("server_exit_code") is None)
    result |= {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rollout_scale.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
