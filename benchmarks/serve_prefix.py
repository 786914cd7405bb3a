"""``dsv32 serve`` with and without its prefix cache across requests, on two agent workloads.

SmolLM2-135M-Instruct (fp32) on loopback, one server at a time on the same loaded model:

- ``chat``: ``--tasks`` tasks × ``--group`` conversations (a GRPO group's G samples of a task), all
  at once through the official ``openai`` client (one thread each), every conversation a long system
  prompt (a tools block of ~``--system-tokens`` tokens, the same for all), its task, and ``--turns``
  turns: the assistant's reply (greedy, ``--new-tokens`` with ``ignore_eos``) and a tool result of
  12–30 tokens sent back as the next user turn;
- ``tokens``: the proof's rollout shape on the token route: ``--turns`` batched calls of
  ``/inference/v1/generate`` with every episode of every task (the tasks' prompts the same long
  block and a task, the G of a task identical), each next prompt the previous prompt, the reply and a
  tool result.

Both sides of each workload — ``--prefix-cache-mb 0`` (no cache) and the default 1024 — run
interleaved (one warm-up each, then ``--reps`` blocks, a fresh server per call) and must give the
same tokens (greedy). Reported: each side's seconds (median and spread), ``speedup`` (no cache /
cache), the cache's hit rate from ``/metrics`` and the prompt tokens sent.

    python benchmarks/serve_prefix.py [--tasks 4] [--group 4] [--turns 3] [--quick]

Writes runs/bench/serve_prefix.json. The servers listen on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import threading
from pathlib import Path

import httpx
import openai
import torch
from _timing import Meter, add_max_wait, interleaved, spread, wait_budget  # beside this script

from dsv32.serve import ServerThread, create_app, load_served

WORDS = [
    "order",
    "invoice",
    "shipment",
    "refund",
    "customer",
    "account",
    "ledger",
    "parcel",
    "route",
    "depot",
]


def system_prompt(tokens: int) -> str:
    """A tools block of about ``tokens`` tokens (function signatures, as an agent's system prompt)."""
    lines, i = ["You can call these tools:"], 0
    while len(" ".join(lines)) < 4 * tokens:
        a, b = WORDS[i % len(WORDS)], WORDS[(3 * i + 1) % len(WORDS)]
        lines.append(f"- get_{a}_{b}_{i}(id: string, limit: integer): the {b} records of one {a}.")
        i += 1
    return "\n".join(lines)


def tool_result(i: int, turn: int) -> str:
    return f"result {i}.{turn}: " + " ".join(str(7 * i + turn + k) for k in range(4 + 3 * (i % 7)))


def metrics(server) -> dict[str, float]:
    text = httpx.get(server.base_url.removesuffix("/v1") + "/metrics", timeout=30).text
    return {m[1]: float(m[2]) for m in re.finditer(r"^dsv32_(prefix_cache_\w+) (\S+)$", text, re.M)}


def chat(served, args, cache_mb: int) -> dict:
    """Every conversation of every task at once, ``--turns`` turns each; the replies and the cache's
    counters."""
    system = system_prompt(args.system_tokens)
    app = create_app(served, max_batch=args.tasks * args.group, prefix_cache_bytes=cache_mb * 2**20)
    replies: dict[int, list[str]] = {}
    with ServerThread(app) as server:

        def conversation(i: int) -> None:
            client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=600)
            messages = [
                {"role": "system", "content": system},
                {
                    "role": "user",
                    "content": f"Task {i // args.group}: find the refunds of order {i // args.group}.",
                },
            ]
            out = []
            for turn in range(args.turns):
                r = client.chat.completions.create(
                    model="smollm2", messages=messages, max_tokens=args.new_tokens, temperature=0,
                    extra_body={"ignore_eos": True},
                )  # fmt: skip
                text = r.choices[0].message.content or ""
                out.append(text)
                messages += [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": tool_result(i, turn)},
                ]
            replies[i] = out

        threads = [threading.Thread(target=conversation, args=(i,)) for i in range(args.tasks * args.group)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        counters = metrics(server)
    return {"replies": [replies[i] for i in sorted(replies)], "metrics": counters}


def tokens(served, args, cache_mb: int) -> dict:
    """``--turns`` batched calls of the token route with every episode; the replies and counters."""
    tokenizer = served.tokenizer
    block = tokenizer.encode(system_prompt(args.system_tokens))
    prompts = [
        block + tokenizer.encode(f" Task {t}: find the refunds of order {t}.")
        for t in range(args.tasks)
        for _ in range(args.group)
    ]
    app = create_app(served, max_batch=8, rl_routes=False, prefix_cache_bytes=cache_mb * 2**20)
    out = []
    with ServerThread(app) as server:
        root = server.base_url.removesuffix("/v1")
        for turn in range(args.turns):
            body = {
                "token_ids": prompts,
                "sampling_params": {"max_tokens": args.new_tokens, "temperature": 0, "stop_token_ids": []},
            }
            reply = httpx.post(root + "/inference/v1/generate", json=body, timeout=600).json()
            got = [c["token_ids"] for c in reply["choices"]]
            out.append(got)
            prompts = [
                p + r + tokenizer.encode(" " + tool_result(i, turn))
                for i, (p, r) in enumerate(zip(prompts, got))
            ]
        counters = metrics(server)
    return {"replies": out, "metrics": counters}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="2 tasks, 300-token block, 16 new tokens, one block")
    ap.add_argument("--out", default="runs/bench")
    add_max_wait(ap)
    args = ap.parse_args()
    if args.quick:
        args.tasks, args.system_tokens, args.new_tokens, args.reps = 2, 300, 16, 1
    torch.set_num_threads(args.threads)
    served = load_served("smollm2", device="cpu")
    meter = Meter(max_wait=wait_budget(args))
    result = {
        "model": "SmolLM2-135M-Instruct",
        "dtype": "float32",
        "threads": torch.get_num_threads(),
        "tasks": args.tasks,
        "group": args.group,
        "turns": args.turns,
        "new_tokens": args.new_tokens,
        "system_tokens": len(served.tokenizer.encode(system_prompt(args.system_tokens))),
    }
    for name, workload in (("chat", chat), ("tokens", tokens)):
        sides = {
            "no_cache": lambda w=workload: w(served, args, 0),
            "cache": lambda w=workload: w(served, args, 1024),
        }
        runs = interleaved(sides, args.reps, meter)
        plain, cached = runs.values["no_cache"], runs.values["cache"]
        counters = cached[-1]["metrics"]
        result[name] = {
            "no_cache_s": spread(runs.seconds["no_cache"]),
            "cache_s": spread(runs.seconds["cache"]),
            "speedup": statistics.median(runs.seconds["no_cache"]) / statistics.median(runs.seconds["cache"]),
            "same_tokens": all(c["replies"] == plain[0]["replies"] for c in cached + plain),
            "prompt_tokens": counters.get("prefix_cache_queries_total"),
            "hit_tokens": counters.get("prefix_cache_hits_total"),
            "hit_rate": counters.get("prefix_cache_hit_rate"),
            "contention": runs.contention(),
        }
        print(name, json.dumps({k: v for k, v in result[name].items() if k != "contention"}), flush=True)
    result |= meter.facts()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve_prefix.json").write_text(json.dumps(result, indent=2))
    print(
        json.dumps({"chat_speedup": result["chat"]["speedup"], "tokens_speedup": result["tokens"]["speedup"]})
    )


if __name__ == "__main__":
    main()
