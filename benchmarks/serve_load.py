"""Load on ``dsv32 serve``: SmolLM2-135M-Instruct on loopback, 1, 4 and 16 concurrent clients.

    python benchmarks/serve_load.py                 # ~5-10 minutes on 2 busy cores
    python benchmarks/serve_load.py --quick         # 1 request of 8 tokens per client, ≤ ~5 minutes

Each client sends ``--requests`` streamed chat completions in a row (``max_tokens`` fixed, greedy,
different prompts) through the official ``openai`` client. Two servers are measured in the same
run on the same loaded model: continuous batching (``--max-batch 16``) and one-at-a-time serving
(``--max-batch 1``, the baseline), each on ``--threads`` torch threads. Per setting: errors, latency p50/p95, time to first token
p50/p95, output tokens/s (completion tokens of all requests / wall time) and the decode batch sizes
the server saw. ``ratio_at_16`` is continuous / one-at-a-time output tokens/s at 16 clients;
``throughput_vs_1_client``: each server's output tokens/s at 4 and 16 clients over its own at 1.
Writes ``runs/bench/serve_load.json`` and ``serve_load.png``. The server listens on 127.0.0.1 only.

``--time-limit`` bounds the run: the 16-client settings run first, and a later setting of a server
starts only if it can finish before the deadline by an estimate from that server's setting before it
(its measured time per round of requests, ``ceil(clients / max-batch)`` rounds per request of each
client, plus the setup and warm-up it took); a setting with no earlier one of its server (the two
16-client settings) starts if the deadline has not passed. So the run ends past ``--time-limit`` by
at most one 16-client setting, or by how far an estimate fell short. Settings not started are
recorded as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import threading
import time
from pathlib import Path

import openai
import torch

from dsv32.serve import ServerThread, create_app, load_served

CONCURRENCY = (1, 4, 16)
SETTINGS = (("continuous batching (max-batch 16)", 16), ("one at a time (max-batch 1)", 1))
TOPICS = [
    "rivers",
    "cats",
    "the moon",
    "bread",
    "trains",
    "music",
    "snow",
    "bees",
    "chess",
    "tea",
    "maps",
    "clocks",
]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def _one_request(client: openai.OpenAI, prompt: str, max_tokens: int) -> dict:
    start = time.perf_counter()
    first, tokens = None, 0
    stream = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - start
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return {"latency": time.perf_counter() - start, "ttft": first, "tokens": tokens}


def run_load(base_url: str, clients: int, requests: int, max_tokens: int) -> dict:
    """``clients`` threads, each sending ``requests`` requests one after another."""
    records: list[dict] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client_loop(k: int) -> None:
        client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)
        for i in range(requests):
            prompt = f"Write two sentences about {TOPICS[(k + i) % len(TOPICS)]}, number {k}.{i}."
            try:
                record = _one_request(client, prompt, max_tokens)
            except openai.OpenAIError as err:
                with lock:
                    errors.append(f"{type(err).__name__}: {err}")
                continue
            with lock:
                records.append(record)

    start = time.perf_counter()
    threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    latencies = [r["latency"] for r in records]
    ttfts = [r["ttft"] for r in records if r["ttft"] is not None]
    tokens = sum(r["tokens"] for r in records)
    return {
        "clients": clients,
        "requests": len(records) + len(errors),
        "errors": len(errors),
        "error_messages": errors[:5],
        "wall_s": wall,
        "completion_tokens": tokens,
        "output_tokens_per_s": tokens / wall,
        "latency_p50_s": _percentile(latencies, 0.5),
        "latency_p95_s": _percentile(latencies, 0.95),
        "ttft_p50_s": _percentile(ttfts, 0.5),
        "ttft_p95_s": _percentile(ttfts, 0.95),
    }


def _batch_sizes(app, warm: tuple[float, int]) -> dict:
    """Decode steps since the warm-up (``warm``: the histogram's sum and count then), and their mean
    batch size."""
    _, total, n = app.state.scheduler.metrics.histograms["batch_size"]
    total, n = total - warm[0], n - warm[1]
    return {"decode_steps": n, "mean_batch_size": total / n if n else 0.0}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for label, rows in results["settings"].items():
        done = [r for r in rows if "skipped" not in r]
        xs = [r["clients"] for r in done]
        axes[0].plot(xs, [r["output_tokens_per_s"] for r in done], "o-", label=label)
        axes[1].plot(xs, [r["latency_p50_s"] for r in done], "o-", label=f"{label} p50")
        axes[1].plot(xs, [r["latency_p95_s"] for r in done], "x--", label=f"{label} p95")
        axes[2].plot(xs, [r["ttft_p50_s"] for r in done], "o-", label=f"{label} p50")
    for ax, title in zip(axes, ("output tokens/s", "request latency (s)", "time to first token (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(CONCURRENCY), [str(c) for c in CONCURRENCY])
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.suptitle(f"dsv32 serve, SmolLM2-135M, CPU ({results['machine']['cpus']} cores) — ratio at 16: "
                 f"{results['ratio_at_16']:.2f}x")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def estimate_s(previous: dict | None, clients: int, max_batch: int, requests: int) -> float | None:
    """Seconds a setting of a server should take, from its ``previous`` setting (``elapsed_s``: the
    whole setting, ``wall_s``: its requests): the same time per round of requests, ``ceil(clients /
    max_batch)`` rounds for each request of a client, plus the same setup. None without one."""
    if previous is None or not previous.get("requests"):
        return None
    rounds = -(-previous["clients"] // max_batch) * (previous["requests"] // previous["clients"])
    per_round = previous["wall_s"] / max(rounds, 1)
    setup = previous["elapsed_s"] - previous["wall_s"]
    return setup + per_round * -(-clients // max_batch) * requests


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument(
        "--time-limit",
        type=float,
        default=900.0,
        help="seconds; a setting that cannot finish in time is skipped (see the module's text)",
    )
    ap.add_argument("--quick", action="store_true", help="1 request of 8 tokens per client, time limit 300 s")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: on a shared 2-core machine two contended "
        "threads decode several times slower than one)",
    )
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.max_tokens, args.time_limit = 1, 8, min(args.time_limit, 300.0)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    served = load_served("smollm2", device="cpu")
    deadline = time.monotonic() + args.time_limit
    settings: dict[str, list[dict]] = {label: [] for label, _ in SETTINGS}
    for clients in sorted(CONCURRENCY, reverse=True):  # the 16-client comparison first
        for label, max_batch in SETTINGS:
            done = [r for r in settings[label] if "skipped" not in r]
            expected = estimate_s(done[-1] if done else None, clients, max_batch, args.requests)
            left = deadline - time.monotonic()
            if left <= 0 or (expected is not None and expected > left):
                why = (
                    "time limit"
                    if left <= 0
                    else f"time limit: estimated {expected:.0f} s, {left:.0f} s left"
                )
                settings[label].append({"clients": clients, "skipped": why})
                print(label, f"{clients} clients skipped ({why})", flush=True)
                continue
            start = time.monotonic()
            app = create_app(served, max_batch=max_batch, max_queue=256)
            with ServerThread(app) as server:
                run_load(server.base_url, 1, 1, 4)  # warm-up, not recorded
                warm = tuple(app.state.scheduler.metrics.histograms["batch_size"][1:])
                row = run_load(server.base_url, clients, args.requests, args.max_tokens)
            row["elapsed_s"] = time.monotonic() - start
            if expected is not None:
                row["estimated_s"] = expected
            settings[label].append(row | _batch_sizes(app, warm))
            print(label, json.dumps({k: v for k, v in row.items() if k != "error_messages"}), flush=True)
    for rows in settings.values():
        rows.sort(key=lambda r: r["clients"])
    at16 = {
        label: next((r for r in rows if r["clients"] == 16 and "skipped" not in r), None)
        for label, rows in settings.items()
    }
    fast, slow = at16.values()
    ratio = fast["output_tokens_per_s"] / slow["output_tokens_per_s"] if fast and slow else float("nan")
    vs_one = {}
    for label, rows in settings.items():
        measured = {r["clients"]: r["output_tokens_per_s"] for r in rows if "skipped" not in r}
        if 1 in measured and measured[1] > 0:
            vs_one[label] = {str(c): v / measured[1] for c, v in measured.items() if c != 1}
    results = {
        "benchmark": "serve_load",
        "model": "SmolLM2-135M-Instruct (fp32)",
        "date": time.strftime("%Y-%m-%d"),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "load_average": os.getloadavg(),
        },
        "requests_per_client": args.requests,
        "max_tokens": args.max_tokens,
        "settings": settings,
        "ratio_at_16": ratio,
        "throughput_vs_1_client": vs_one,
        "time_limit_s": args.time_limit,
    }
    (out / "serve_load.json").write_text(json.dumps(results, indent=2))
    plot(results, out / "serve_load.png")
    print(f"ratio at 16 clients (continuous / one at a time): {ratio:.2f}x -> {out / 'serve_load.json'}")


if __name__ == "__main__":
    main()
