"""Environment overhead: what confinement costs per tool call, and episodes per minute.

    python benchmarks/envs.py            # ~2 minutes on 2 cores; writes runs/bench/envs.json and envs.png
    python benchmarks/envs.py --quick    # fewer repetitions and episodes

Each sandboxed number has its unconfined baseline measured in the same run:

- ``sandbox_start``: ``sandbox.run(["true"])`` per isolation that works here, against
  ``subprocess.run(["true"])``; ``sandbox_python``: the same for ``python -c pass``;
- ``kernel``: start of the sandboxed Jupyter kernel and one ``1 + 1`` cell round trip, against an
  unconfined ``jupyter_client`` kernel (TCP, no sandbox);
- ``kernel_starts``: 32 sandboxed kernels started together (one ``print`` cell each, then closed),
  each start holding its turn until the kernel first answers (the library's way) against holding it
  through ``jupyter_client``'s readiness check as well (its IOPub wait), the two alternated twice;
- ``general_call``: one general-tools tool call (a sandboxed process loads the bundle and runs the
  function on SQLite), against calling the same function in-process;
- ``episodes_per_minute``: the ``reference`` backend through ``dsv32.agent.run_episode`` on the
  code-interpreter and general-tools task sets with 1, 2 and 4 episodes in parallel.

``ratios``: each sandboxed median over its baseline's (``sandbox_true/<kind>``, ``sandbox_python/<kind>``,
``kernel_start``, ``kernel_round_trip``, ``general_call``); ``kernel_starts_speedup``: the held
turn's wall time over the released one's.

BM25 search queries and SWE test runs are measured by ``benchmarks/envs_search_swe.py``.
Means and medians in milliseconds; the machine's load average is recorded with them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dsv32.envs import sandbox
from dsv32.envs.base import resolve_tasks

OUT = Path("runs/bench")


def timed(fn, n: int) -> dict:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - start))
    return {
        "mean_ms": round(statistics.mean(times), 2),
        "median_ms": round(statistics.median(times), 2),
        "n": n,
    }


def sandbox_costs(n: int) -> dict:
    kinds = [k for k in sandbox.KINDS if sandbox._works(k)]
    out = {"baseline_true": timed(lambda: subprocess.run(["true"], check=True), n)}
    out["baseline_python"] = timed(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), n)
    for kind in kinds:
        out[f"{kind}_true"] = timed(
            lambda k=kind: sandbox.run(["true"], timeout_s=10, memory_mb=256, kind=k), n
        )
        out[f"{kind}_python"] = timed(
            lambda k=kind: sandbox.run([sys.executable, "-c", "pass"], timeout_s=10, memory_mb=512, kind=k), n
        )
    return out


def kernel_costs(n: int) -> dict:
    from jupyter_client import KernelManager

    from dsv32.envs.interpreter import SandboxedKernel

    out = {}
    start = time.perf_counter()
    with SandboxedKernel() as k:
        out["sandboxed_start_ms"] = round(1000 * (time.perf_counter() - start), 1)
        out["sandboxed_round_trip"] = timed(lambda: k.execute("1 + 1"), n)
    start = time.perf_counter()
    km = KernelManager(kernel_name="python3")
    km.start_kernel(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    out["baseline_start_ms"] = round(1000 * (time.perf_counter() - start), 1)
    out["baseline_round_trip"] = timed(
        lambda: kc.execute_interactive("1 + 1", timeout=30, output_hook=lambda m: None), n
    )
    kc.stop_channels()
    km.shutdown_kernel(now=True)
    return out


def concurrent_starts(kernels: int, rounds: int = 2) -> dict:
    """Wall time of ``kernels`` starts at once (thread per kernel), a start's turn released when the
    kernel answers vs when the client's readiness check is over too; the best of ``rounds`` each."""
    from concurrent.futures import ThreadPoolExecutor

    from dsv32.envs.interpreter import kernel as kernel_module

    connect = kernel_module.SandboxedKernel._connect

    def held_to_ready(self, deadline=None, answered=None):  # the turn ends with _start, after readiness
        return connect(self, deadline, None)

    def one(i: int) -> str:
        with kernel_module.SandboxedKernel() as k:
            return k.execute(f"print({i})").text.strip()

    modes = {"released_at_answer_s": connect, "held_to_ready_s": held_to_ready}
    walls: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(rounds):
        for mode, way in modes.items():
            kernel_module.SandboxedKernel._connect = way
            try:
                start = time.perf_counter()
                with ThreadPoolExecutor(kernels) as pool:
                    texts = list(pool.map(one, range(kernels)))
                walls[mode].append(time.perf_counter() - start)
            finally:
                kernel_module.SandboxedKernel._connect = connect
            if texts != [str(i) for i in range(kernels)]:
                raise RuntimeError(f"a kernel answered wrongly: {texts}")
    return {
        "kernels": kernels,
        "concurrent_starts": kernel_module.CONCURRENT_STARTS,
        **{mode: round(min(w), 2) for mode, w in walls.items()},
        "rounds": rounds,
    }


def general_costs(n: int) -> dict:
    from dsv32.envs.general import GeneralToolEnv

    task = next(t for t in resolve_tasks("general-tools", "smoke") if t.info["category"] == "inventory")
    env = GeneralToolEnv()
    env.reset(task)
    out = {"sandboxed_call": timed(lambda: env.call("list_products", {}), n)}
    spec = importlib.util.spec_from_file_location("bench_tools", Path(task.info["bundle"]) / "tools.py")
    tools = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tools)
    with tempfile.TemporaryDirectory() as tmp:
        db_path = Path(tmp, "db.sqlite")
        db_path.write_bytes(Path(task.info["bundle"], "db.sqlite").read_bytes())

        def in_process() -> None:
            db = sqlite3.connect(db_path)
            db.row_factory = sqlite3.Row
            tools.list_products(db)
            db.close()

        out["baseline_in_process"] = timed(in_process, n)
    env.close()
    return out


def episode_rates(n_tasks: int) -> dict:
    from dsv32.agent import ScriptedBackend
    from dsv32.cli.envs import run_tasks

    out = {}
    for env_name in ("code-interpreter", "general-tools"):
        tasks = resolve_tasks(env_name, "heldout")[:n_tasks]
        for parallel in (1, 2, 4):
            summary = run_tasks(
                env_name, tasks, lambda env, task: ScriptedBackend(env.reference(task)), parallel=parallel
            )
            out[f"{env_name}/parallel={parallel}"] = {
                "episodes_per_minute": summary["episodes_per_minute"],
                "mean_reward": summary["mean_reward"],
                "n": summary["n"],
            }
    return out


def overhead_ratios(result: dict) -> dict:
    """Each sandboxed median over its unconfined baseline's, from the same run."""
    box, kernel, general = result["sandbox"], result["kernel"], result["general"]
    ratios = {}
    for name in ("true", "python"):
        for kind in sandbox.KINDS:
            if f"{kind}_{name}" in box:
                ratios[f"sandbox_{name}/{kind}"] = (
                    box[f"{kind}_{name}"]["median_ms"] / box[f"baseline_{name}"]["median_ms"]
                )
    ratios["kernel_start"] = kernel["sandboxed_start_ms"] / kernel["baseline_start_ms"]
    ratios["kernel_round_trip"] = (
        kernel["sandboxed_round_trip"]["median_ms"] / kernel["baseline_round_trip"]["median_ms"]
    )
    ratios["general_call"] = (
        general["sandboxed_call"]["median_ms"] / general["baseline_in_process"]["median_ms"]
    )
    starts = result["kernel_starts"]
    ratios["kernel_starts_speedup"] = starts["held_to_ready_s"] / starts["released_at_answer_s"]
    return ratios


def plot(rates: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for env_name in ("code-interpreter", "general-tools"):
        xs = [1, 2, 4]
        ax.plot(
            xs, [rates[f"{env_name}/parallel={p}"]["episodes_per_minute"] for p in xs], "o-", label=env_name
        )
    ax.set_xlabel("episodes in parallel")
    ax.set_ylabel("episodes per minute")
    ax.set_xticks([1, 2, 4])
    ax.legend()
    ax.set_title(f"reference episodes, {os.cpu_count()} CPU cores")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=OUT, help="output directory")
    args = parser.parse_args()
    n, n_tasks = (5, 4) if args.quick else (20, 8)
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "isolation": sandbox.isolation().kind,
        "load_average_before": os.getloadavg(),
        "sandbox": sandbox_costs(n),
        "kernel": kernel_costs(n),
        "kernel_starts": concurrent_starts(16 if args.quick else 32),
        "general": general_costs(n),
    }
    result["ratios"] = overhead_ratios(result)
    result["episodes"] = episode_rates(n_tasks)
    result["load_average_after"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "envs.json").write_text(json.dumps(result, indent=1))
    plot(result["episodes"], args.out / "envs.png")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
