"""``dsv32 serve`` against vLLM on the same CPU: SmolLM2-135M-Instruct, float32 and bfloat16, one
server at a time in one run, and how much of this CPU's matmul throughput batched decode reaches.

1. **Matmul FLOP/s** (in this process, ``--threads`` torch threads): every ``nn.Linear`` of SmolLM2
   (the 30 layers' seven projections and the LM head) applied in order to 32 rows, as one decode step
   at 32 rows runs them, on the model's own weights, as stored (torch's ``linear``) and packed for
   oneDNN; FLOP/s = 2 · rows · weights / seconds, the faster of the two. Beside it, a 1024³ square
   matmul for scale.
2. **Batched decode** (same process): the engine's running batch (``dsv32.engine.batch``, the
   serve scheduler's) at 32 rows of ~200-token prompts, greedy; the decode FLOP/s is the same
   matmul FLOPs per token over the measured step time (attention's few FLOPs not counted), and
   ``decode_flops_fraction_<dtype>`` is it over (1).
3. **Serving** (``/v1/completions``): 1, 8 and 32 concurrent clients, each sending ``--requests``
   requests one after another: ~``--prompt-len``-token prompts (standard-library docstrings),
   ``--new-tokens`` tokens with ``ignore_eos``, greedy. Output tokens/s = completion tokens / wall.
4. **Agentic** (``/inference/v1/generate``, the rollout route): the agentic proof's episode shapes,
   ``--tasks`` code-interpreter tasks × ``--group`` episodes, ``--turns`` calls each; every call's
   prompt is the previous prompt, the sampled reply and a tool result; temperature 0.8, top-p 0.95,
   ``--agentic-tokens`` tokens per call with ``ignore_eos``, unseeded (vLLM 0.32's CPU sampler fails
   a seeded top-p request: "CPU Generator does not use offset"). Each engine is driven the way dsv32's
   remote rollout engine drives it: dsv32 gets one batched request per call, vLLM one request per
   row, all rows at once.

The servers: ``dsv32 serve smollm2 --dtype D --threads T --max-batch 64`` and ``vllm serve`` of the
same weights (saved as a Hugging Face directory) with ``--dtype D`` from the virtualenv ``make
test-vllm`` builds (``--vllm-python``, default ``$DSV32_VLLM_PYTHON`` or ``.venv-vllm/bin/python``);
without it the dsv32 side still runs and the ratios are null. Both listen on 127.0.0.1 only; one
runs at a time, after one warm-up request. Ratios are dsv32 / vLLM (> 1: dsv32 faster).

    python benchmarks/engine_vs_vllm.py [--dtypes float32 bfloat16] [--concurrency 1 8 32] [--quick]

Writes runs/bench/engine_vs_vllm.{json,png}; the last line printed is one JSON object with
``serve_ratio_bfloat16`` / ``serve_ratio_float32`` (per concurrency), ``agentic_ratio`` (per dtype),
``decode_flops_fraction_bf16`` and the full record.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import torch
from engine_dtype import text_prompts  # beside this script

from dsv32.chat import encode_messages
from dsv32.engine.batch import RunningBatch
from dsv32.engine.dtype import describe_bf16
from dsv32.engine.models import load_smollm2
from dsv32.serve import free_port, wait_until_up

ROOT = Path(__file__).resolve().parent.parent
TOOL_RESULTS = ("Out[1]: 7690173393386420", "NameError: name 'x' is not defined", "Out[2]: [3, 1, 4, 1, 5]")


# ----------------------------------------------------------------------------------- in process
def linears(model) -> list[torch.Tensor]:
    """The weights of every ``nn.Linear`` (LM head included), in forward order."""
    return [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]


@torch.no_grad()
def matmul_flops(model, rows: int, reps: int) -> dict:
    """FLOP/s of the model's linears applied to ``rows`` rows in order (best of ``reps``), with the
    weights as stored (torch's ``linear``) and packed for oneDNN (what the engine's decode step uses);
    ``gflops`` is the faster of the two. Beside them, a 1024³ matmul in the model's dtype."""
    weights = linears(model)
    xs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights}
    flop = sum(2 * rows * w.numel() for w in weights)
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in weights]

    def plain() -> None:
        for w in weights:
            torch.nn.functional.linear(xs[w.shape[1]], w)

    def blocked() -> None:
        for w, p in zip(weights, packed, strict=True):
            torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], p, None, "none", [], "")

    best = {}
    for name, run in (("linear", plain), ("packed", blocked)):
        run()
        best[name] = flop / min(_timed(run) for _ in range(reps)) / 1e9
    a = torch.randn(1024, 1024, dtype=weights[0].dtype)
    torch.mm(a, a)
    square = min(_timed(lambda: torch.mm(a, a)) for _ in range(reps * 3))
    return {"rows": rows, "gflops": max(best.values()), "linear_gflops": best["linear"],
            "packed_gflops": best["packed"], "flop_per_token": flop // rows,
            "square_1024_gflops": 2 * 1024**3 / square / 1e9}  # fmt: skip


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@torch.no_grad()
def decode_speed(model, prompts: list[list[int]], steps: int) -> dict:
    """Mean seconds of a running batch's decode step at ``len(prompts)`` rows (after 4 warm-up steps)."""
    batch = RunningBatch(model)
    for p in prompts:
        batch.add(p, 1, steps + 8)
    tokens = batch.logits.float().argmax(-1).tolist()
    for i in range(4 + steps):
        if i == 4:
            start = time.perf_counter()
        batch.step(tokens)
        tokens = batch.logits.float().argmax(-1).tolist()
    return {"rows": len(prompts), "steps": steps, "step_s": (time.perf_counter() - start) / steps}


# ------------------------------------------------------------------------------------ servers
@contextmanager
def server(cmd: list[str], port: int, env: dict, log: Path, timeout: float):
    """Start ``cmd`` (a server on ``port``), yield its URL and its start-up seconds, stop it."""
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_up(url, proc, timeout)
            yield url, time.perf_counter() - start
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def dsv32_command(dtype: str, port: int, threads: int) -> list[str]:
    return [sys.executable, "-c", "import sys; from dsv32.cli import main; sys.exit(main())", "serve", "smollm2",
            "--port", str(port), "--device", "cpu", "--dtype", dtype, "--threads", str(threads),
            "--max-batch", "64", "--max-queue", "256", "--enable-rl-routes", "--served-model-name", "smollm2"]  # fmt: skip


def vllm_command(python: str, model_dir: Path, dtype: str, port: int) -> list[str]:
    return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
            "--max-model-len", "2048", "--max-num-seqs", "64", "--enable-scale-out"]  # fmt: skip


def serve_load(url: str, prompts: list[str], clients: int, requests: int, new_tokens: int) -> dict:
    """``clients`` threads, each sending ``requests`` completions one after another."""
    tokens, errors, lock = [], [], threading.Lock()

    def client(k: int) -> None:
        with httpx.Client(base_url=url, timeout=900) as http:
            for i in range(requests):
                body = {"model": "smollm2", "prompt": prompts[(k * requests + i) % len(prompts)],
                        "max_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}  # fmt: skip
                try:
                    reply = http.post("/v1/completions", json=body)
                    reply.raise_for_status()
                    n = reply.json()["usage"]["completion_tokens"]
                except (httpx.HTTPError, KeyError, ValueError) as err:
                    with lock:
                        errors.append(f"{type(err).__name__}: {str(err)[:200]}")
                    continue
                with lock:
                    tokens.append(n)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {"clients": clients, "requests": len(tokens), "errors": errors[:5], "wall_s": round(wall, 2),
            "completion_tokens": sum(tokens), "tok_s": round(sum(tokens) / wall, 2)}  # fmt: skip


def agentic_load(url: str, name: str, first: list[list[int]], tool: list[list[int]], args) -> dict:
    """The episodes' ``--turns`` calls (see the module docstring); output tokens/s over all calls."""
    prompts = [list(p) for p in first for _ in range(args.group)]
    params = {"max_tokens": args.agentic_tokens, "temperature": 0.8, "top_p": 0.95, "logprobs": 0,
              "ignore_eos": True}  # fmt: skip
    generated, calls = 0, []
    with httpx.Client(base_url=url, timeout=1800) as http:

        def post(token_ids) -> list[list[int]]:
            body = {"model": "smollm2", "token_ids": token_ids, "sampling_params": params}
            reply = http.post("/inference/v1/generate", json=body)
            reply.raise_for_status()
            return [c["token_ids"] for c in reply.json()["choices"]]

        start = time.perf_counter()
        for turn in range(args.turns):
            t0 = time.perf_counter()
            if name == "dsv32":
                replies = post(prompts)
            else:
                with ThreadPoolExecutor(len(prompts)) as pool:
                    replies = [r[0] for r in pool.map(post, prompts)]
            calls.append(round(time.perf_counter() - t0, 2))
            generated += sum(len(r) for r in replies)
            task_tool = tool[turn % len(tool)]
            prompts = [p + r + task_tool for p, r in zip(prompts, replies, strict=True)]
        wall = time.perf_counter() - start
    return {"episodes": len(prompts), "turns": args.turns, "calls_s": calls, "wall_s": round(wall, 2),
            "completion_tokens": generated, "tok_s": round(generated / wall, 2),
            "last_prompt_tokens": max(len(p) for p in prompts)}  # fmt: skip


def agentic_prompts(tokenizer, tasks: int) -> tuple[list[list[int]], list[list[int]]]:
    """The first prompts of ``tasks`` code-interpreter training tasks (system prompt with the python
    tool, the task), and the tool results' tokens."""
    from dsv32.envs.base import get_env

    spec = get_env("code-interpreter")
    env = spec.factory()
    try:
        first = []
        for task in spec.task_sets["train"]()[:tasks]:
            messages = env.reset(task)
            messages[0] = {**messages[0], "tools": env.tools()}
            first.append(tokenizer.encode(encode_messages(messages)))
    finally:
        env.close()
    tool = [tokenizer.encode(f"\n\n<tool_result>{t}</tool_result>\n\n") for t in TOOL_RESULTS]
    return first, tool


def measure_server(name: str, url: str, texts: list[str], first, tool, args) -> dict:
    serve_load(url, texts, 1, 1, 8)  # warm-up
    rows = {}
    for clients in args.concurrency:
        requests = args.requests if clients > 1 else args.requests + 1
        rows[str(clients)] = serve_load(url, texts, clients, requests, args.new_tokens)
        print(f"  {name}: {clients} clients {rows[str(clients)]['tok_s']} tok/s", flush=True)
    agentic = None
    if args.tasks:
        try:
            agentic = agentic_load(url, name, first, tool, args)
            print(f"  {name}: agentic {agentic['tok_s']} tok/s ({agentic['calls_s']} s per call)", flush=True)
        except httpx.HTTPError as err:  # the serving rows stand without it
            agentic = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
            print(f"  {name}: agentic {agentic['error']}", flush=True)
    return {"serve": rows, "agentic": agentic}


# ----------------------------------------------------------------------------------- report
def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def speeds(servers: dict, concurrency: list[int]) -> dict:
    """``{dtype: {workload: {server: output tok/s or None}}}``, workloads ``"1"``, ``"8"``, ...
    (clients) and ``"agentic"``: what the ratios, the plot and ``run_all``'s table read."""
    table = {}
    for dtype, sides in servers.items():
        table[dtype] = {}
        for workload in [*map(str, concurrency), "agentic"]:
            row = {}
            for name in ("dsv32", "vllm"):
                rec = sides.get(name) or {}
                one = rec.get("agentic") if workload == "agentic" else (rec.get("serve") or {}).get(workload)
                row[name] = (one or {}).get("tok_s")
            table[dtype][workload] = row
    return table


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = result["tok_s"]
    fig, axes = plt.subplots(1, len(table), figsize=(5.5 * len(table), 3.8), squeeze=False)
    for ax, (dtype, rows) in zip(axes[0], table.items(), strict=True):
        labels = [w if w == "agentic" else f"{w} clients" for w in rows]
        for j, name in enumerate(("dsv32", "vllm")):
            values = [row[name] or 0 for row in rows.values()]
            ax.bar([i + 0.4 * j for i in range(len(values))], values, width=0.4, label=name)
        ax.set_xticks([i + 0.2 for i in range(len(labels))], labels)
        ax.set_ylabel("output tokens/s")
        ax.set_title(f"SmolLM2-135M, {dtype}, {result['threads']} threads")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=2, help="per client (one more at 1 client)")
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--tasks", type=int, default=8, help="agentic tasks (0: no agentic workload)")
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--agentic-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--vllm-python", default=os.environ.get("DSV32_VLLM_PYTHON", str(ROOT / ".venv-vllm/bin/python"))
    )
    ap.add_argument("--no-vllm", action="store_true", help="the dsv32 side only")
    ap.add_argument("--quick", action="store_true", help="1 and 8 clients, 16 tokens, 2 agentic tasks")
    ap.add_argument("--json", action="store_true", help="(the last line is always the JSON object)")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args()
    if args.quick:
        args.concurrency, args.new_tokens, args.requests = [1, 8], 16, 1
        args.tasks, args.agentic_tokens = 2, 16
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    vllm_python = None if args.no_vllm or not Path(args.vllm_python).is_file() else args.vllm_python
    model32, tokenizer = load_smollm2(torch.float32)
    token_prompts = text_prompts(tokenizer, 32, args.prompt_len)
    texts = [tokenizer.decode(p) for p in token_prompts]
    first, tool = agentic_prompts(tokenizer, args.tasks) if args.tasks else ([], [])
    load_before = [round(x, 2) for x in os.getloadavg()]

    in_process = {}
    for dtype in args.dtypes:
        model = model32 if dtype == "float32" else load_smollm2(torch.bfloat16)[0]
        flops = matmul_flops(model.eval(), 32, reps=5)
        dec = decode_speed(model, token_prompts[:32], steps=16 if args.quick else 48)
        dec["gflops"] = flops["flop_per_token"] * dec["rows"] / dec["step_s"] / 1e9
        in_process[dtype] = {"matmul": flops, "decode": dec, "fraction": dec["gflops"] / flops["gflops"]}
        print(f"{dtype}: matmuls {flops['gflops']:.1f} GFLOP/s at 32 rows (1024³ {flops['square_1024_gflops']:.1f}), "
              f"decode {dec['gflops']:.1f} GFLOP/s = {in_process[dtype]['fraction']:.0%}", flush=True)  # fmt: skip
        if model is not model32:
            del model

    servers: dict[str, dict] = {}
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory(prefix="engine-vs-vllm-") as tmp:
        model_dir = Path(tmp) / "smollm2"
        model32.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        del model32
        for dtype in args.dtypes:
            servers[dtype] = {}
            sides = [("dsv32", None)] + ([("vllm", vllm_python)] if vllm_python else [])
            for name, python in sides:
                port = free_port()
                if name == "dsv32":
                    cmd, side_env = dsv32_command(dtype, port, args.threads), env
                else:
                    cmd = vllm_command(python, model_dir, dtype, port)
                    side_env = {**env, "VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_SERVER_DEV_MODE": "1"}
                print(f"{name} {dtype}: starting", flush=True)
                try:
                    with server(cmd, port, side_env, out / f"engine_vs_vllm_{name}_{dtype}.log", 900) as (
                        url,
                        up,
                    ):
                        record = measure_server(name, url, texts, first, tool, args)
                        record["startup_s"] = round(up, 1)
                except Exception as err:  # one side failing must not lose the other's numbers
                    record = {"error": f"{type(err).__name__}: {str(err)[:500]}"}
                    print(f"  {name} {dtype}: {record['error']}", flush=True)
                servers[dtype][name] = record

    table = speeds(servers, args.concurrency)

    def ratios(dtype: str, workloads: list[str]) -> dict:
        return {w: ratio(table[dtype][w]["dsv32"], table[dtype][w]["vllm"]) for w in workloads}

    shape = {
        "tasks": args.tasks,
        "group": args.group,
        "turns": args.turns,
        "tokens_per_call": args.agentic_tokens,
    }
    result = {
        "benchmark": "engine_vs_vllm",
        "model": "SmolLM2-135M-Instruct",
        "machine": platform.processor() or platform.machine(),
        "cpu": describe_bf16(),
        "threads": args.threads,
        "torch": torch.__version__,
        "vllm_python": vllm_python,
        "concurrency": args.concurrency,
        "prompt_tokens": args.prompt_len,
        "new_tokens": args.new_tokens,
        "agentic_shape": shape,
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "in_process": in_process,
        "servers": servers,
        "tok_s": table,
        **{f"serve_ratio_{d}": ratios(d, [str(c) for c in args.concurrency]) for d in args.dtypes},
        "agentic_ratio": {d: ratios(d, ["agentic"])["agentic"] for d in args.dtypes},
        "decode_flops_fraction_bf16": (
            round(in_process["bfloat16"]["fraction"], 3) if "bfloat16" in in_process else None
        ),
    }
    (out / "engine_vs_vllm.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out / "engine_vs_vllm.png")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
