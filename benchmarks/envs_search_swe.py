"""Overhead of the search and SWE environments: what one tool call and one episode cost.

    python benchmarks/envs_search_swe.py            # writes runs/bench/envs_search_swe.json
    python benchmarks/envs_search_swe.py --quick    # fewer repetitions and episodes

Search: building the standard-library corpus and its BM25 index from scratch (a private cache), and
loading them again; the latency of one ``search`` call over the default corpus (the shipped
questions' reference queries); against a baseline measured in the same run — a plain Python scan
that counts the query's terms in every document — on the same first 5 (20 without ``--quick``)
queries, each query searched both ways in turn (``bm25_speedup_vs_scan``: the ratio of the medians);
one ``open`` call; reference episodes per minute with 1, 2 and 4 run in parallel (threads, one
environment each).

SWE: each shipped package's suite through the sandbox (``run_tests``'s path), against the same pytest
command without the sandbox: one untimed run of each, then 2 (4) timed runs of each, the order of the
two alternating; medians and ``sandbox_overhead`` (sandboxed / plain); ``reset`` (copy of the snapshot
plus the bug); and reference episodes per minute (two suite runs and one targeted run each) with 1, 2
and 4 in parallel.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dsv32.envs import Episode, sandbox
from dsv32.envs.search import SearchEnv, stdlib_tasks
from dsv32.envs.search.index import tokenize
from dsv32.envs.swe import SweEnv, mined_tasks, pristine
from dsv32.envs.swe.testrun import run_pytest, test_env

OUT = Path("runs/bench")  # under the working directory, like every benchmark


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn(*args, **kwargs)
    return time.perf_counter() - start, value


def quantiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "median_ms": 1e3 * statistics.median(xs),
        "p90_ms": 1e3 * xs[int(0.9 * (len(xs) - 1))],
        "n": len(xs),
    }


def scan_search(docs, query: str, k: int) -> list[str]:
    """The baseline: count the query's tokens in every document's tokens, keep the top k."""
    terms = set(tokenize(query))
    scored = [(sum(t in terms for t in tokenize(d.text)), d.id) for d in docs]
    return [i for s, i in sorted(scored, reverse=True)[:k] if s > 0]


def play(env, task) -> float:
    """One reference episode through the tools; returns its reward."""
    env.reset(task)
    reference = env.reference(task)
    for msg in reference:
        for call in msg.get("tool_calls", []):
            env.call(call["function"]["name"], json.loads(call["function"]["arguments"]))
    reward = env.reward(Episode([], reference[-1]["content"])).value
    env.close()
    return reward


def episodes_per_minute(make_env, tasks, parallel: int) -> dict:
    def worker(chunk):
        env = make_env()
        return [play(env, t) for t in chunk]

    chunks = [tasks[i::parallel] for i in range(parallel)]
    with ThreadPoolExecutor(parallel) as pool:
        wall, results = timed(lambda: list(pool.map(worker, chunks)))
    rewards = [r for chunk in results for r in chunk]
    return {"parallel": parallel, "episodes": len(rewards), "wall_s": wall, "episodes_per_min": 60 * len(rewards) / wall,
            "mean_reward": sum(rewards) / len(rewards)}  # fmt: skip


def bench_search(quick: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env_cache = {**os.environ, "DSV32_CACHE_DIR": tmp}
        code = "from dsv32.envs.search import shared_index; shared_index()"
        cold, _ = timed(subprocess.run, [sys.executable, "-c", code], env=env_cache, check=True)
        warm, _ = timed(subprocess.run, [sys.executable, "-c", code], env=env_cache, check=True)
    tasks = stdlib_tasks()
    env = SearchEnv()
    docs = env.index.docs
    queries = [s["query"] for t in tasks for s in t.info["reference"]][: 40 if quick else None]
    bm25, opens = [], []
    for q in queries:
        bm25.append(timed(env.call, "search", {"query": q, "k": 5})[0])
        opens.append(timed(env.call, "open", {"doc_id": q.replace(" ", "."), "page": 1})[0])
    # the ratio: both searches on the same (smaller: the scan is slow) query set, one after the other
    same_bm25, scan = [], []
    for q in queries[: 5 if quick else 20]:
        same_bm25.append(timed(env.call, "search", {"query": q, "k": 5})[0])
        scan.append(timed(scan_search, docs, q, 5)[0])
    rates = [episodes_per_minute(SearchEnv, tasks[: 20 if quick else 100], p) for p in (1, 2, 4)]
    return {
        "corpus_docs": len(docs),
        "corpus_chars": sum(len(d.text) for d in docs),
        "build_corpus_and_index_cold_s": cold,
        "load_corpus_and_index_warm_s": warm,
        "search_bm25": quantiles(bm25),
        "search_bm25_scan_queries": quantiles(same_bm25),
        "search_scan_baseline": quantiles(scan),
        "bm25_speedup_vs_scan": statistics.median(scan) / statistics.median(same_bm25),
        "open": quantiles(opens),
        "episodes": rates,
    }


def _suite_size(tasks, spec: str) -> int:
    info = next(t for t in tasks if t.info["package"] == spec).info
    return len(info["FAIL_TO_PASS"]) + len(info["PASS_TO_PASS"])


def bench_swe(quick: bool) -> dict:
    tasks = mined_tasks()
    runs = {}
    for spec in sorted({t.info["package"] for t in tasks}):
        root = pristine(spec)
        pp = next(t.info["pythonpath"] for t in tasks if t.info["package"] == spec)
        with tempfile.TemporaryDirectory() as tmp:
            repo = Path(tmp) / "repo"
            subprocess.run(["cp", "-r", str(root), str(repo)], check=True)
            argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
            env = {**os.environ, **test_env(repo, pp, Path(tmp))}
            sides = {
                "sandboxed": functools.partial(run_pytest, repo, pythonpath=pp),
                "plain": functools.partial(subprocess.run, argv, cwd=repo, env=env, capture_output=True),
            }
            for run in sides.values():  # warm-up (untimed): the page cache, the sandbox's first probe
                run()
            times = {name: [] for name in sides}
            for rep in range(2 if quick else 4):  # the order alternates: sandboxed first, then plain first
                for name in sorted(sides, reverse=rep % 2 == 1):
                    times[name].append(timed(sides[name])[0])
        boxed, plain = statistics.median(times["sandboxed"]), statistics.median(times["plain"])
        runs[spec] = {"sandboxed_s": boxed, "plain_s": plain, "sandbox_overhead": boxed / plain,
                      "repetitions": len(times["plain"]), "tests": _suite_size(tasks, spec)}  # fmt: skip
    env = SweEnv()
    resets = [timed(env.reset, t)[0] for t in tasks[:6]]
    env.close()
    sample = tasks[:: 3 if quick else 2][:4]
    rates = [episodes_per_minute(SweEnv, sample, p) for p in (1, 2, 4)]
    return {"suite_run": runs, "reset": quantiles(resets), "episodes": rates}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and episodes")
    ap.add_argument("--out", type=Path, default=OUT, help="output directory")
    args = ap.parse_args()
    result = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "sandbox": sandbox.isolation().kind, "load_avg_start": os.getloadavg()},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "search": bench_search(args.quick),
        "swe": bench_swe(args.quick),
    }  # fmt: skip
    result["machine"]["load_avg_end"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "envs_search_swe.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
