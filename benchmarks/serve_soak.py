"""Soak of ``dsv32 serve``: a bounded mixed load on 127.0.0.1 for ``--seconds``, weights updated
between phases, the server's memory watched.

    python benchmarks/serve_soak.py                      # 10 minutes, the tiny V3.2-format model
    python benchmarks/serve_soak.py --seconds 60         # one minute
    python benchmarks/serve_soak.py --quick              # one minute
    python benchmarks/serve_soak.py --model tiny-llama   # any model dsv32 serve loads (smollm2, a path)

``dsv32 serve MODEL --enable-rl-routes`` runs in a process of its own (its memory is its own) with
``--threads`` torch threads. ``--clients`` threads each send requests one after another until the
time is up, each drawn (seeded) from the mix: chat completions streamed and not, with tools
(``tool_choice`` auto, streamed and not), text completions streamed and not, token ids on
``/inference/v1/generate``, a stream the client closes after its first chunks (a cancellation) and
a long request whose client gives up after 0.2 s (a disconnect). The run is cut into ``--phases``
phases; between two, while the load goes on, the RL routes pause the server (``keep``) and resume
it, and new weights (the previous ones plus small noise) are pushed as a file through
``/update_weights``. The default model, ``tiny-v32``, is the tiny random V3.2 network (``tiny-native``)
saved with a byte-level tokenizer and the V3.2 tokens, so chat and tool requests have a format
(``tiny-llama`` has no chat template: with it the chat kinds are left out, and the JSON says so).

Reported (``runs/bench/serve_soak.json``, the last line of stdout one JSON object, and
``serve_soak.png``): requests by kind and status; ``client_5xx`` (replies, and error events in
streams, of the server's failures) and ``server_5xx`` (its own count, ``dsv32_requests_total`` in
``/metrics``), both expected 0; latency p50/p99 of the requests that ran to their end, overall and
per kind; the server's resident memory every second (``rss_mb``), its start, its end, its peak, and
its slope after the first phase (``rss_slope_mb_per_min``, least squares; flat is ~0); the load
average of the machine before and after, since the latencies depend on it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import torch

KINDS = ("chat", "chat_stream", "tools", "tools_stream", "completion", "completion_stream", "generate",
         "cancel_stream", "disconnect")  # fmt: skip
CHAT_KINDS = {"chat", "chat_stream", "tools", "tools_stream"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
TOPICS = ["rivers", "cats", "the moon", "bread", "trains", "snow", "bees", "tea"]
DISCONNECT_AFTER_S = 0.2


def tiny_v32(path: Path) -> Path:
    """The tiny random V3.2 network with a byte-level tokenizer and the V3.2 special tokens, saved as a
    checkpoint directory ``dsv32 serve`` loads (chat in the V3.2 format, DSML tool calls)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from dsv32.chat import EOS, add_v32_special_tokens
    from dsv32.engine.models import tiny_native_config
    from dsv32.model import DeepseekV32

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core)
    add_v32_special_tokens(tokenizer)
    tokenizer.eos_token = tokenizer.pad_token = EOS
    tokenizer.bos_token = "<｜begin▁of▁sentence｜>"
    eos = tokenizer.convert_tokens_to_ids(EOS)
    torch.manual_seed(0)
    config = tiny_native_config(
        vocab_size=len(tokenizer), eos_token_id=eos, pad_token_id=eos, bos_token_id=tokenizer.bos_token_id,
        max_position_embeddings=4096,
    )  # fmt: skip
    DeepseekV32(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else None


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def slope_per_min(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(seconds, MB)`` points, in MB per minute."""
    if len(points) < 3:
        return None
    n = len(points)
    mt, mv = sum(t for t, _ in points) / n, sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return 60 * sum((t - mt) * (v - mv) for t, v in points) / var if var else None


def server_5xx(metrics: str) -> int:
    """5xx responses in the server's own count (``dsv32_requests_total``)."""
    pattern = re.compile(r'^dsv32_requests_total\{[^}]*status="(\d+)"[^}]*\}\s+([0-9.e+]+)$')
    total = 0.0
    for line in metrics.splitlines():
        match = pattern.match(line)
        if match and match.group(1).startswith("5"):
            total += float(match.group(2))
    return int(total)


class Load:
    """The clients: each a thread with its own connection pool, sending until ``deadline``."""

    def __init__(self, root: str, name: str, kinds: list[str], vocab: int, max_tokens: int, seed: int):
        self.root, self.name, self.kinds, self.vocab = root, name, kinds, vocab
        self.max_tokens, self.seed = max_tokens, seed
        self.records: list[dict] = []
        self.lock = threading.Lock()
        self.t0 = time.monotonic()

    def run(self, clients: int, deadline: float) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=self._client, args=(k, deadline), daemon=True) for k in range(clients)
        ]
        for t in threads:
            t.start()
        return threads

    def _client(self, k: int, deadline: float) -> None:
        rng = random.Random(f"{self.seed}:{k}")
        with httpx.Client(base_url=self.root, timeout=120) as http:
            i = 0
            while time.monotonic() < deadline:
                kind = rng.choice(self.kinds)
                start = time.monotonic()
                try:
                    status, note = self._request(http, kind, rng, f"{k}.{i}")
                except httpx.HTTPError as err:  # the transport failed: counted, not a server status
                    status, note = "transport", f"{type(err).__name__}: {err}"[:200]
                record = {"kind": kind, "status": status, "note": note,
                          "t": round(start - self.t0, 3), "latency": time.monotonic() - start}  # fmt: skip
                with self.lock:
                    self.records.append(record)
                i += 1

    def _request(self, http: httpx.Client, kind: str, rng: random.Random, tag: str) -> tuple[str, str]:
        tokens = rng.randint(2, self.max_tokens)
        prompt = f"Tell me about {rng.choice(TOPICS)} ({tag})."
        chat = {"model": self.name, "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
                "temperature": rng.choice([0.0, 0.7, 1.0])}  # fmt: skip
        if kind.startswith("tools"):
            chat |= {"tools": TOOLS, "tool_choice": "auto"}
        text = {"model": self.name, "prompt": prompt, "max_tokens": tokens, "temperature": 0.8}
        if kind in ("chat", "tools"):
            return self._plain(http, "/v1/chat/completions", chat)
        if kind in ("chat_stream", "tools_stream"):
            return self._stream(http, "/v1/chat/completions", chat | {"stream": True})
        if kind == "completion":
            return self._plain(http, "/v1/completions", text)
        if kind == "completion_stream":
            return self._stream(http, "/v1/completions", text | {"stream": True})
        if kind == "generate":
            ids = [rng.randrange(self.vocab) for _ in range(rng.randint(1, 12))]
            body = {
                "token_ids": ids,
                "sampling_params": {"max_tokens": tokens, "temperature": 1.0, "seed": 1},
            }
            return self._plain(http, "/inference/v1/generate", body)
        if kind == "cancel_stream":
            long = text | {"stream": True, "max_tokens": 200, "ignore_eos": True}
            return self._stream(http, "/v1/completions", long, stop_after=2)
        # disconnect: a long request whose client stops waiting
        long = text | {"max_tokens": 400, "ignore_eos": True}
        try:
            r = http.post("/v1/completions", json=long, timeout=DISCONNECT_AFTER_S)
        except httpx.TimeoutException:
            return "client_gone", ""
        return str(r.status_code), ""

    @staticmethod
    def _plain(http: httpx.Client, path: str, body: dict) -> tuple[str, str]:
        r = http.post(path, json=body)
        return str(r.status_code), "" if r.status_code < 400 else r.text[:200]

    @staticmethod
    def _stream(http: httpx.Client, path: str, body: dict, stop_after: int | None = None) -> tuple[str, str]:
        chunks = 0
        with http.stream("POST", path, json=body) as r:
            if r.status_code != 200:
                r.read()
                return str(r.status_code), r.text[:200]
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:  # an error event: the status its type stands for
                    server = event["error"].get("type") == "server_error"
                    return ("500-in-stream" if server else "400-in-stream"), line[:200]
                chunks += 1
                if stop_after is not None and chunks >= stop_after:
                    return "client_cancelled", ""  # leaving the block closes the connection
        return "200", ""


def maintenance(root: str, model, boundaries: list[float], tmp: Path, seed: int, log: list[dict]) -> None:
    """At each boundary (monotonic time): pause (keep) and resume, then push new weights by file."""
    from dsv32.rl.engines import FileWeightSync, RemoteEngine

    engine = RemoteEngine(root, sync=FileWeightSync(tmp / "weights"))
    g = torch.Generator().manual_seed(seed)
    for version, at in enumerate(boundaries, start=1):
        time.sleep(max(0.0, at - time.monotonic()))
        entry: dict = {"version": version}
        t = time.monotonic()
        try:
            with httpx.Client(base_url=root, timeout=120) as http:
                entry["pause"] = http.post("/pause", params={"mode": "keep"}).status_code
                time.sleep(0.5)
                entry["resume"] = http.post("/resume").status_code
            with torch.no_grad():
                for p in model.parameters():
                    if p.is_floating_point():
                        p.add_(torch.randn(p.shape, generator=g) * 1e-3)
            entry["sync_s"] = round(engine.sync(model, version), 3)
            entry["served_version"] = engine.weight_version()
        except Exception as err:  # recorded: the soak reports it rather than stopping
            entry["error"] = f"{type(err).__name__}: {err}"[:300]
        entry["seconds"] = round(time.monotonic() - t, 3)
        log.append(entry)


def start_server(model: str, threads: int, log_path: Path) -> tuple[subprocess.Popen, str]:
    from dsv32.serve import free_port, wait_until_up

    port = free_port()
    cmd = [sys.executable, "-c", "import sys; from dsv32.cli import main; sys.exit(main())", "serve", model,
           "--port", str(port), "--device", "cpu", "--threads", str(threads), "--max-batch", "8",
           "--max-queue", "256", "--served-model-name", "soak", "--enable-rl-routes"]  # fmt: skip
    log = log_path.open("w")
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    root = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(root, proc, timeout=300)
    except Exception:
        proc.kill()
        proc.wait()
        raise
    return proc, root


def summarize(records: list[dict]) -> dict:
    done = [r for r in records if r["status"] == "200"]
    by_kind = {}
    for kind in sorted({r["kind"] for r in records}):
        rows = [r for r in records if r["kind"] == kind]
        ok = [r["latency"] for r in rows if r["status"] == "200"]
        statuses: dict[str, int] = {}
        for r in rows:
            statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        by_kind[kind] = {"requests": len(rows), "statuses": statuses,
                         "latency_p50_s": percentile(ok, 0.5), "latency_p99_s": percentile(ok, 0.99)}  # fmt: skip
    five = [r for r in records if r["status"].startswith("5")]
    return {
        "requests": len(records),
        "completed": len(done),
        "client_5xx": len(five),
        "client_5xx_examples": [r["note"] for r in five[:5]],
        "transport_errors": sum(r["status"] == "transport" for r in records),
        "cancelled_by_client": sum(r["status"] in ("client_cancelled", "client_gone") for r in records),
        "latency_p50_s": percentile([r["latency"] for r in done], 0.5),
        "latency_p99_s": percentile([r["latency"] for r in done], 0.99),
        "by_kind": by_kind,
    }


def plot(result: dict, records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_rss, ax_lat) = plt.subplots(1, 2, figsize=(12, 4))
    t, mb = zip(*result["rss_mb"]) if result["rss_mb"] else ((), ())
    ax_rss.plot(t, mb, "-")
    for at in result["update_at_s"]:
        ax_rss.axvline(at, color="gray", linestyle=":", linewidth=1)
    ax_rss.set_xlabel("seconds")
    ax_rss.set_ylabel("server RSS (MB)")
    slope = result["rss_slope_mb_per_min"]
    ax_rss.set_title(f"resident memory (dotted: weight updates); slope {slope:.2f} MB/min" if slope is not None
                     else "resident memory")  # fmt: skip
    for kind in sorted({r["kind"] for r in records}):
        rows = [r for r in records if r["kind"] == kind and r["status"] == "200"]
        ax_lat.plot([r["t"] for r in rows], [r["latency"] for r in rows], ".", markersize=3, label=kind)
    ax_lat.set_yscale("log")
    ax_lat.set_xlabel("seconds")
    ax_lat.set_ylabel("latency (s)")
    ax_lat.set_title(f"p50 {result['latency_p50_s']:.3g} s, p99 {result['latency_p99_s']:.3g} s; "
                     f"5xx: {result['client_5xx']} (server's count {result['server_5xx']})")  # fmt: skip
    ax_lat.legend(fontsize=6, ncol=2)
    fig.suptitle(f"dsv32 serve soak: {result['model']}, {result['seconds']:g} s, {result['clients']} clients")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600.0, help="how long the load runs (default 600)")
    ap.add_argument("--model", default="tiny-v32", help="tiny-v32 (default), tiny-llama, smollm2 or a path")
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--phases", type=int, default=4, help="a weight update between each two")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="60 seconds")
    ap.add_argument("--out", default="runs/bench")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds = min(args.seconds, 60.0)
    if args.seconds <= 0 or args.clients < 1 or args.phases < 1:
        ap.error("--seconds, --clients and --phases must be positive")
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from dsv32.engine.models import load_model

    with tempfile.TemporaryDirectory(prefix="serve-soak-") as tmp_name:
        tmp = Path(tmp_name)
        model = str(tiny_v32(tmp / "tiny-v32")) if args.model == "tiny-v32" else args.model
        weights = load_model(model, device="cpu").model  # the same architecture: the updates' source
        load_before = os.getloadavg()
        proc, root = start_server(model, args.threads, tmp / "server.log")
        try:
            with httpx.Client(base_url=root, timeout=60) as http:
                probe = {"model": "soak", "messages": [{"role": "user", "content": "hi"}]}
                chat = http.post("/tokenize", json=probe).status_code == 200
            kinds = [k for k in KINDS if chat or k not in CHAT_KINDS]
            samples: list[tuple[float, float]] = []
            stop = threading.Event()
            t0 = time.monotonic()

            def sample() -> None:
                while not stop.wait(1.0):
                    mb = rss_mb(proc.pid)
                    if mb is not None:
                        samples.append((round(time.monotonic() - t0, 2), round(mb, 1)))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            deadline = t0 + args.seconds
            load = Load(root, "soak", kinds, weights.config.vocab_size, args.max_tokens, args.seed)
            load.t0 = t0
            boundaries = [t0 + args.seconds * p / args.phases for p in range(1, args.phases)]
            updates: list[dict] = []
            keeper = threading.Thread(
                target=maintenance, args=(root, weights, boundaries, tmp, args.seed, updates), daemon=True
            )
            keeper.start()
            for t in load.run(args.clients, deadline):
                t.join()
            keeper.join(timeout=300)
            stop.set()
            sampler.join()
            with httpx.Client(base_url=root, timeout=60) as http:
                metrics = http.get("/metrics").text
                alive = http.get("/health").status_code == 200
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        server_log = (tmp / "server.log").read_text()[-3000:]
    warm = args.seconds / args.phases  # memory after the first phase: caches and allocator warmed up
    settled = [(t, mb) for t, mb in samples if t >= warm]
    result = {
        "model": args.model,
        "seconds": args.seconds,
        "clients": args.clients,
        "phases": args.phases,
        "kinds": kinds,
        "skipped_kinds": [k for k in KINDS if k not in kinds],
        **summarize(load.records),
        "server_5xx": server_5xx(metrics),
        "server_alive_after": alive,
        "weight_updates": updates,
        "update_at_s": [round(b - t0, 2) for b in boundaries],
        "rss_mb": samples,
        "rss_start_mb": samples[0][1] if samples else None,
        "rss_after_first_phase_mb": settled[0][1] if settled else None,
        "rss_end_mb": samples[-1][1] if samples else None,
        "rss_max_mb": max((mb for _, mb in samples), default=None),
        "rss_slope_mb_per_min": slope_per_min(settled),
        "machine": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
    }
    if result["client_5xx"] or result["server_5xx"] or not alive:
        result["server_log_tail"] = server_log
    (out / "serve_soak.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, load.records, out / "serve_soak.png")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
