"""``dsv32 synth general|search|filter``: agentic task synthesis (paper §3.2.3) at scale — concurrent
episodes, resume after interruption (run the same command again), dedup, tokens and cost per kept
task, provenance on every item; ``dsv32 synth envs``: general-agent environments drawn from a domain
vocabulary without a model, in the same bundle format. See docs/synth.md."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dsv32.cli import command, non_negative_int, positive_int, probability

SPEC_HELP = "openai:MODEL@BASE_URL[,key=value...] or local:NAME[,...] (keys: temperature, price_in, ...)"


def _spec(text: str):
    from dsv32.synth.backends import parse_spec

    return parse_spec(text)


def _pairs(items: list[str]) -> dict:
    from dsv32.synth.records import SynthError

    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SynthError(f"--env-option {item!r} must look like key=value")
        out[key] = value
    return out


def _print(summary: dict, out: str) -> int:
    """Print the summary; a run with jobs that failed (an endpoint down) ends with an error saying so."""
    from dsv32.synth.records import SynthError

    print(json.dumps({k: v for k, v in summary.items() if k != "provenance"}, indent=1))
    print(f"written to {out}")
    if summary["jobs_with_errors"]:
        raise SynthError(
            f"{summary['jobs_with_errors']} job(s) failed (first: {summary['first_error']}); the others are "
            f"committed in {out}; run the same command again to retry them"
        )
    return 0


def run_general(args: argparse.Namespace) -> int:
    from dsv32.synth.commands import run_general as run
    from dsv32.synth.versions import Limits

    limits = Limits(timeout_s=args.sandbox_timeout, memory_mb=args.sandbox_memory)
    summary = run(
        args.category, args.episodes, _spec(args.generator), args.out, workers=args.workers,
        max_versions=args.max_versions, max_steps=args.max_steps, thinking=not args.no_thinking,
        corpus=args.corpus, limits=limits,
    )  # fmt: skip
    return _print(summary, args.out)


def run_search(args: argparse.Namespace) -> int:
    from dsv32.synth.commands import run_search as run

    summary = run(
        args.entities, _spec(args.constructor), [_spec(a) for a in args.answerer], _spec(args.verifier),
        args.out, rubric=_spec(args.rubric) if args.rubric else None, workers=args.workers,
        max_mentions=args.max_mentions, depth=args.depth, breadth=args.breadth, verify_passes=args.passes,
        corpus=args.corpus, seed=args.seed,
    )  # fmt: skip
    return _print(summary, args.out)


def run_filter(args: argparse.Namespace) -> int:
    from dsv32.synth.commands import run_filter as run

    summary = run(
        args.env, args.tasks, _spec(args.policy), args.out, workers=args.workers, limit=args.limit,
        env_options=_pairs(args.env_option), k=args.k, n=args.n, drop_solved=args.drop_solved,
        stop_early=args.stop_early, max_steps=args.max_steps, seed=args.seed,
    )  # fmt: skip
    return _print(summary, args.out)


def run_envs(args: argparse.Namespace) -> int:
    import sys
    import time

    from dsv32.synth.programmatic import cached_set, generate, sandbox_check, tasks_of
    from dsv32.synth.records import SynthError

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    options = {"seed": args.seed, "tasks_per_env": args.tasks_per_env, "heldout": args.heldout_domain or None,
               "heldout_fraction": args.heldout_fraction, "workers": args.workers, "progress": progress}  # fmt: skip
    start = time.perf_counter()
    if args.out is None:
        out = cached_set(args.n, **options)
    else:
        out = args.out
        generate(out, args.n, **options)
    seconds = time.perf_counter() - start
    manifest = json.loads((Path(out) / "manifest.json").read_text(encoding="utf-8"))
    summary = {"out": str(Path(out).absolute()), "seconds": round(seconds, 1), **manifest["counts"],
               "split": manifest["split"]}  # fmt: skip
    if args.sandbox:
        rows = [t.to_dict() for t in tasks_of(out)]
        checked = sandbox_check(rows, args.sandbox, seed=args.seed)
        summary["sandbox"] = {"checked": len(checked), "failed": [r for r in checked if not r["ok"]]}
    print(json.dumps(summary, indent=1))
    if args.sandbox and summary["sandbox"]["failed"]:
        raise SynthError(f"{len(summary['sandbox']['failed'])} bundle(s) failed in the sandbox (see above)")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "synth", help="synthesize agentic tasks (general environments, search QA) and filter by pass@k"
    )
    ssub = p.add_subparsers(dest="synth_cmd", metavar="COMMAND", required=True)

    g = ssub.add_parser(
        "general", help="general-agent environments: db, tools, task, solution, verifier; escalation"
    )
    g.add_argument("--category", action="append", required=True, help="task category (repeat for several)")
    g.add_argument("--episodes", type=positive_int, default=1, help="synthesis episodes per category")
    g.add_argument("--generator", required=True, help=f"the synthesizing model: {SPEC_HELP}")
    g.add_argument("--max-versions", type=positive_int, default=4, help="accepted versions per episode")
    g.add_argument("--max-steps", type=positive_int, default=60, help="model calls per episode")
    g.add_argument("--corpus", help="give the agent search/open over 'stdlib' or a JSONL corpus")
    g.add_argument("--sandbox-timeout", type=positive_int, default=30, help="seconds per sandboxed check")
    g.add_argument("--sandbox-memory", type=positive_int, default=1024, help="MB per sandboxed check")
    g.add_argument("--no-thinking", action="store_true", help="chat mode instead of thinking mode")

    s = ssub.add_parser("search", help="search QA: construct, answer with several agents, verify, rubric")
    s.add_argument("--entities", type=positive_int, required=True, help="long-tail entities to try")
    s.add_argument("--constructor", required=True, help=f"question-construction agent: {SPEC_HELP}")
    s.add_argument(
        "--answerer",
        action="append",
        required=True,
        help="an answer agent (repeat; prompt=terse|careful|default)",
    )
    s.add_argument("--verifier", required=True, help="the verification agent")
    s.add_argument("--rubric", help="the rubric writer (default: the verifier's model)")
    s.add_argument("--corpus", help="JSONL corpus of id/title/text rows (default: the standard library)")
    s.add_argument("--depth", type=positive_int, default=2, help="documents a question must chain")
    s.add_argument(
        "--breadth",
        type=positive_int,
        default=5,
        help="the most results one search of the question constructor returns (at most 20)",
    )
    s.add_argument("--passes", type=positive_int, default=2, help="verification passes")
    s.add_argument(
        "--max-mentions", type=positive_int, default=3, help="long tail: documents naming the entity"
    )
    s.add_argument("--seed", type=int, default=0)

    f = ssub.add_parser(
        "filter", help="pass@k of a target policy: drop never-solved (and always-solved) tasks"
    )
    f.add_argument("--env", required=True, help="environment (dsv32.envs registry), e.g. search")
    f.add_argument("--tasks", help="a task set name or a JSONL file (default: the environment's first set)")
    f.add_argument("--policy", required=True, help=f"the target policy: {SPEC_HELP}")
    f.add_argument("--k", type=positive_int, default=100, help="k of pass@k (paper: 100)")
    f.add_argument("--n", type=positive_int, help="samples per task (default k; at least k)")
    f.add_argument("--drop-solved", action="store_true", help="also drop tasks solved in every sample")
    f.add_argument("--stop-early", action="store_true", help="stop a task's sampling at its first success")
    f.add_argument("--limit", type=positive_int, help="only the first LIMIT tasks")
    f.add_argument("--max-steps", type=positive_int, default=20, help="model calls per episode")
    f.add_argument(
        "--env-option", action="append", default=[], metavar="KEY=VALUE", help="environment argument"
    )
    f.add_argument("--seed", type=int, help="sample i uses seed + i")

    e = ssub.add_parser(
        "envs", help="general-agent environments drawn from a domain vocabulary (no model): db, tools, tasks"
    )
    e.add_argument("--n", type=positive_int, required=True, help="environments to write")
    e.add_argument("--seed", type=int, default=0, help="the same seed gives byte-identical bundles")
    e.add_argument("--out", help="output directory (default: the cache, reused when present)")
    e.add_argument("--tasks-per-env", type=positive_int, default=2, help="tasks per environment (1-4)")
    e.add_argument(
        "--heldout-domain",
        action="append",
        metavar="DOMAIN",
        help="hold out this domain (repeat; default: drawn)",
    )
    e.add_argument(
        "--heldout-fraction", type=probability, default=0.2, help="share of domains held out when drawn"
    )
    e.add_argument(
        "--sandbox",
        type=non_negative_int,
        default=10,
        metavar="K",
        help="also play K tasks in the sandbox (0: none)",
    )
    e.add_argument("--workers", type=positive_int, default=1, help="processes writing and checking bundles")
    command(e, run_envs)

    for q, run in ((g, run_general), (s, run_search), (f, run_filter)):
        q.add_argument("--out", required=True, help="output directory (run again to resume)")
        q.add_argument("--workers", type=positive_int, default=1, help="episodes run concurrently")
        command(q, run)
