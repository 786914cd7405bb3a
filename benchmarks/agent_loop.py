"""The agent loop's own overhead per step, at 10, 50 and 200 steps, with a scripted backend.

Each episode makes ``n`` tool-calling steps (one call to a trivial tool each) and then answers. The
*baseline* is the same work written as the smallest possible loop in the same run: ask the scripted
backend for the next reply, call the tool function directly, append the result. The loop's overhead
per step is ``(agent time − baseline time) / steps``: tool-call validation (pydantic), the worker
thread of the tool timeout, trajectory records, events, id assignment. It must not grow with the
number of steps (the loop never re-walks the conversation): the ratio of the per-step overhead at
200 steps to that at 10 is reported. Times are CPU time of this process (``time.process_time``, all
threads), so that waiting for a core on a shared machine does not count as overhead. Variants: tools run inline (``tool_timeout_s=None``, no worker
thread) and with context management on (a window large enough never to trigger, so every step also
counts the prompt's tokens).

    python benchmarks/agent_loop.py [--repeats 5] [--out runs/bench]

Writes ``runs/bench/agent_loop.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from dsv32.agent import Agent, ScriptedBackend

STEPS = (10, 50, 200)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def script(n: int) -> list[dict]:
    call = {"type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    replies = [{"reasoning_content": "add again", "tool_calls": [call]} for _ in range(n)]
    return [*replies, {"reasoning_content": "done", "content": "3"}]


def baseline(n: int) -> float:
    """The same episode as a minimal hand-written loop: seconds."""
    backend = ScriptedBackend(script(n))
    start = time.process_time()
    messages = [{"role": "user", "content": "go"}]
    while True:
        reply = backend.complete(messages, [], thinking=True).message
        messages.append(reply)
        if not reply.get("tool_calls"):
            break
        for k, call in enumerate(reply["tool_calls"]):
            arguments = json.loads(call["function"]["arguments"])
            messages.append({"role": "tool", "tool_call_id": str(k), "content": str(add(**arguments))})
    return time.process_time() - start


def agent(n: int, **options) -> float:
    backend = ScriptedBackend(script(n))
    loop = Agent(backend, [add], max_steps=n + 1, **options)
    start = time.process_time()
    trajectory = loop.run("go")
    elapsed = time.process_time() - start
    assert trajectory.stop_reason == "answer" and trajectory.num_steps == n + 1
    return elapsed


VARIANTS = {
    "agent": {},
    "agent, inline tools": {"tool_timeout_s": None},
    "agent, context management on": {"context_window": 10**9, "context": "discard_all"},
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="episodes per point (the median is kept)")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args(argv)
    agent(10)  # warm-up: imports, pydantic model building
    rows = []
    for n in STEPS:
        base = statistics.median(baseline(n) for _ in range(args.repeats))
        row = {"steps": n + 1, "baseline_s": base}
        for name, options in VARIANTS.items():
            total = statistics.median(agent(n, **options) for _ in range(args.repeats))
            row[name] = {"total_s": total, "overhead_per_step_us": 1e6 * (total - base) / (n + 1)}
        rows.append(row)
        print(json.dumps(row))
    linearity = {
        name: rows[-1][name]["overhead_per_step_us"] / rows[0][name]["overhead_per_step_us"]
        for name in VARIANTS
    }
    result = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "repeats": args.repeats,
        "rows": rows,
        "overhead_ratio_200_vs_10": linearity,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "agent_loop.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"overhead_ratio_200_vs_10": linearity}, indent=2))
    _plot(rows, out / "agent_loop.png")
    return 0


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    steps = [r["steps"] for r in rows]
    for name in VARIANTS:
        ax.plot(steps, [r[name]["overhead_per_step_us"] for r in rows], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("steps per episode")
    ax.set_ylabel("loop overhead per step (µs, vs minimal loop)")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.set_title("dsv32.agent: overhead per step stays flat")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
