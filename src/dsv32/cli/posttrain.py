"""``dsv32 posttrain cold-start``: the data steps of V3.2's post-training pipeline (cold-start
conversations from verified trajectories)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from dsv32.chat.templates import EPISODE_PROMPTS as PROMPTS
from dsv32.cli import command, flag_overrides, non_negative_int, positive_int


def _tasks(env: str, tasks: str | None, limit: int | None):
    from dsv32.envs.base import resolve_tasks

    rows = resolve_tasks(env, tasks)
    return rows[:limit] if limit else rows


def run_proof(config: str | None, overrides: list[str], out: str | None, progress: bool = True) -> dict:
    """The proof run: held-out greedy accuracy and well-formed tool use of the base model, after
    cold-start SFT on verified tool transcripts, and after agentic GRPO (``report.{json,md,png}``),
    with the held-out curve during GRPO and, with ``[transfer]``, an environment never trained on.
    Every recipe section is checked before anything is loaded or written."""
    import functools
    import time
    from contextlib import contextmanager

    from dsv32.cli.posttrain_recipe import read_posttrain_recipe
    from dsv32.envs.base import get_env, resolve_tasks
    from dsv32.envs.interpreter import InterpreterEnv
    from dsv32.rl.agentic.episodes import EpisodeSettings
    from dsv32.rl.agentic.trainer import EnvItem, episode_settings, evaluate_agentic, train_agentic
    from dsv32.rl.grpo.policy import Policy
    from dsv32.rl.posttrain_report import first_tasks, machine, report_dict, rl_curve, write_report
    from dsv32.runlog import read_metrics
    from dsv32.synth.coldstart import build_coldstart
    from dsv32.train.sft import train_sft
    from dsv32.train.sft.model import prepare_sft_model, vocab_matrices

    recipe = read_posttrain_recipe(config, overrides, out)
    root, tasks_cfg, sft_cfg, rl_cfg = recipe.root, recipe.tasks, recipe.sft, recipe.rl
    train, heldout = recipe.generate_tasks()
    validation = recipe.validation_tasks(train)
    transfer_items: list[EnvItem] = []
    if recipe.transfer is not None:
        t = recipe.transfer
        transfer_items = [
            EnvItem(x, t.env, get_env(t.env).factory) for x in resolve_tasks(t.env, t.set)[: t.tasks]
        ]

    t0, load_start, minutes = time.time(), machine()["load_average_1_5_15"], {}
    sm = prepare_sft_model(sft_cfg.model.name, sft_cfg.model.device)
    root.mkdir(parents=True, exist_ok=True)  # only now: bad input writes nothing
    recipe.write_tasks(train, heldout, validation)
    make_env = functools.partial(InterpreterEnv, **tasks_cfg.env_options)
    held = [EnvItem(t, "code-interpreter", make_env) for t in heldout]
    settings = episode_settings(rl_cfg)
    max_new = rl_cfg.rl.sampling.max_new_tokens
    policy = Policy(sm.model, sm.tokenizer, sm.kind, thinking=True, source=sft_cfg.model.name)
    evals: dict[str, dict] = {}
    transfer: dict[str, dict] = {}

    @contextmanager
    def timed(stage: str):
        t = time.time()
        yield
        minutes[stage] = round((time.time() - t) / 60, 2)

    def evaluate(stage: str) -> None:
        with timed(f"eval_{stage}"):
            evals[stage] = evaluate_agentic(policy, held, settings, max_new)
        (root / f"eval_{stage}.json").write_text(json.dumps(evals[stage], indent=1) + "\n")
        print(
            f"{stage}: accuracy {evals[stage]['accuracy']:.3f}, tool use {evals[stage]['tool_call_valid']:.3f}",
            flush=True,
        )
        if transfer_items:
            t = recipe.transfer
            other = EpisodeSettings(
                t.prompt, t.max_steps, settings.thinking, tool_timeout_s=settings.tool_timeout_s
            )
            with timed(f"transfer_{stage}"):
                transfer[stage] = evaluate_agentic(policy, transfer_items, other, max_new)
            (root / f"transfer_{stage}.json").write_text(json.dumps(transfer[stage], indent=1) + "\n")
            print(f"{stage}: transfer ({t.env}) accuracy {transfer[stage]['accuracy']:.3f}", flush=True)

    evaluate("base")
    with timed("cold_start"):
        cold = build_coldstart(
            make_env,
            recipe.coldstart_tasks(train),
            root / "coldstart.jsonl",
            prompt=tasks_cfg.prompt,
            overwrite=True,
        )
        if validation:  # the SFT stage's held-out loss: reference transcripts of the validation tasks
            build_coldstart(
                make_env, validation, root / "validation.jsonl", prompt=tasks_cfg.prompt, overwrite=True
            )
            sft_cfg.data.eval_path = str(root / "validation.jsonl")
    sft_cfg.data.path = str(root / "coldstart.jsonl")
    with timed("sft"):
        train_sft(sft_cfg, model=sm, resume=False, progress=progress)
    evaluate("sft")
    pool = {"rule": "all", "train": len(train), "pool": len(train)}
    if tasks_cfg.rl_pool == "unsolved":  # GRPO draws from the training tasks SFT left unsolved
        with timed("rl_pool"):
            items = [EnvItem(t, "code-interpreter", make_env) for t in train]
            passed = evaluate_agentic(policy, items, settings, max_new)
        (root / "rl_pool_sft.json").write_text(json.dumps(passed, indent=1) + "\n")
        pool = recipe.use_rl_pool(train, {o["id"] for o in passed["outcomes"] if o["correct"]})
        print(
            f"rl pool: {pool['pool']} of {len(train)} training tasks (the SFT model solves "
            f"{pool['solved_by_sft']} greedily)",
            flush=True,
        )
    rl_cfg.rl.policy.name = str(root / "sft" / "model")
    if not recipe.rl_model.train_embeddings:
        for p in vocab_matrices(sm.model):
            p.requires_grad_(False)
    if rl_cfg.rl.eval.every:  # the held-out curve: the trainer evaluates every `eval.every` steps
        rl_cfg.agentic.eval_tasks = tasks_cfg.curve_tasks  # the first ones of the held-out file
    with timed("rl"):
        train_agentic(
            rl_cfg,
            policy=policy,
            resume=False,
            progress=progress,
            evaluate_before=False,
            evaluate_after=False,
        )
    evaluate("rl")
    during = read_metrics(root / "rl" / "eval.jsonl") if (root / "rl" / "eval.jsonl").exists() else []
    rl_metrics = read_metrics(root / "rl" / "metrics.jsonl")
    points = [  # every point counts the same (first) held-out tasks
        {**first_tasks(evals["sft"], tasks_cfg.curve_tasks), "step": 0},
        *during,
        {**first_tasks(evals["rl"], tasks_cfg.curve_tasks), "step": rl_cfg.rl.grpo.steps},
    ]
    details = {
        "model": sft_cfg.model.name,
        "task": f"code-interpreter {'/'.join(tasks_cfg.categories)}, "
        + (f"difficulty {tasks_cfg.difficulty}" if tasks_cfg.difficulty else "difficulties 1-5"),
        "evals": {
            k: {x: y for x, y in v.items() if x not in ("samples", "outcomes")} for k, v in evals.items()
        },
        "cold_start": cold.to_dict(),
        "tasks": {
            "train": len(train),
            "coldstart": len(recipe.coldstart_tasks(train)),
            "heldout": len(heldout),
            "validation": len(validation),
            "shared_prompts": 0,  # generate_tasks / validation_tasks refuse any
            "rl_pool": pool,
        },
        "grpo": {
            k: getattr(rl_cfg.rl.grpo, k)
            for k in ("steps", "prompts_per_step", "group_size", "lr", "kl_coef")
        },
        "stage_minutes": minutes,
        "machine": machine(),
        "load_start": load_start,
        "peak_memory_mb": peak_memory_mb(),
        "rl_trained_parameters": sum(p.numel() for p in sm.model.parameters() if p.requires_grad),
        "first_update_abs_log_ratio_max": max(
            (r["first_update_abs_log_ratio"] for r in rl_metrics if "first_update_abs_log_ratio" in r),
            default=None,
        ),
        "command": "dsv32 posttrain proof "
        + " ".join([config or "", *[f"--set {o}" for o in overrides]]).strip(),
    }
    transfer_report = None
    if transfer_items:
        t = recipe.transfer
        transfer_report = {"env": t.env, "set": t.set, "tasks": len(transfer_items), "prompt": t.prompt}
        for stage, summary in transfer.items():
            transfer_report[f"accuracy_{stage}"] = summary["accuracy"]
            transfer_report[f"tool_call_valid_{stage}"] = summary["tool_call_valid"]
    report = report_dict(
        evals,
        len(heldout),
        (time.time() - t0) / 60,
        details,
        transfer=transfer_report,
        curve=rl_curve(rl_metrics, points),
    )
    write_report(root, report, read_metrics(root / "sft" / "metrics.jsonl"), rl_metrics)
    return report


def peak_memory_mb() -> float:
    """This process's peak resident memory (the kernels and sandboxes are other processes)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)


def add_cold_start(psub: argparse._SubParsersAction) -> None:
    q = psub.add_parser(
        "cold-start",
        help="verified thinking-with-tools conversations from reference solutions or a teacher (JSONL for sft)",
    )
    q.add_argument("--env", required=True, help="environment name (dsv32 envs list), e.g. code-interpreter")
    q.add_argument(
        "--tasks", help="the environment's task set name or a tasks JSONL file (default: its first set)"
    )
    q.add_argument("--limit", type=positive_int, help="use the first N tasks")
    q.add_argument(
        "--teacher", help="backend spec (openai:MODEL@URL or local:NAME); default: reference solutions"
    )
    q.add_argument("--samples", type=positive_int, default=1, help="teacher episodes per task")
    q.add_argument("--max-steps", type=positive_int, default=8, help="model calls per teacher episode")
    q.add_argument("--prompt", default="reasoning_agent", choices=PROMPTS)
    q.add_argument("--workers", type=positive_int, default=4, help="episodes run at once (threads)")
    q.add_argument("--out", required=True, help="output JSONL of conversations")
    q.add_argument("--overwrite", action="store_true", help="replace --out if it exists")

    def run(args: argparse.Namespace) -> int:
        from dsv32.envs.base import get_env
        from dsv32.synth.backends import parse_spec
        from dsv32.synth.coldstart import build_coldstart

        spec = get_env(args.env)
        teacher = parse_spec(args.teacher) if args.teacher else None
        tasks = _tasks(args.env, args.tasks, args.limit)
        report = build_coldstart(
            spec.factory, tasks, args.out, prompt=args.prompt, teacher=teacher, samples=args.samples,
            max_steps=args.max_steps, workers=args.workers, overwrite=args.overwrite,
        )  # fmt: skip
        print(json.dumps({"out": args.out, **report.to_dict()}))
        return 0

    command(q, run)


def add_distill(psub: argparse._SubParsersAction) -> None:
    q = psub.add_parser(
        "distill",
        help="specialists generate on their domains; verified, deduplicated, weighted union → SFT set",
    )
    q.add_argument(
        "--specialist",
        action="append",
        default=[],
        metavar="DOMAIN=BACKEND",
        help="a domain (an environment name) and its specialist (openai:MODEL@URL or local:NAME)",
    )
    q.add_argument(
        "--tasks",
        action="append",
        default=[],
        metavar="DOMAIN=SET_OR_JSONL",
        help="the domain's tasks (default: its environment's first task set)",
    )
    q.add_argument("--weight", action="append", default=[], metavar="DOMAIN=W", help="mix weight (default 1)")
    q.add_argument("--limit", type=positive_int, help="use the first N tasks of each domain")
    q.add_argument("--samples", type=positive_int, default=1, help="episodes per task")
    q.add_argument("--max-steps", type=positive_int, default=8)
    q.add_argument("--prompt", default="reasoning_agent", choices=PROMPTS)
    q.add_argument("--workers", type=positive_int, default=4)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--out", required=True, help="output JSONL of conversations")
    q.add_argument("--overwrite", action="store_true", help="replace --out if it exists")

    def run(args: argparse.Namespace) -> int:
        from dsv32.envs.base import get_env
        from dsv32.synth.backends import parse_spec
        from dsv32.synth.distill import Specialist, distill, parse_pairs
        from dsv32.synth.records import SynthError

        specs = parse_pairs(args.specialist, "--specialist")
        tasks, weights = parse_pairs(args.tasks, "--tasks"), parse_pairs(args.weight, "--weight")
        unknown = sorted((set(tasks) | set(weights)) - set(specs))
        if unknown:
            raise SynthError(f"--tasks/--weight name domains without a --specialist: {unknown}")
        specialists = []
        for domain, text in specs.items():
            try:
                weight = float(weights.get(domain, "1"))
            except ValueError:
                raise SynthError(f"--weight {domain}={weights[domain]!r} is not a number") from None
            specialists.append(
                Specialist(domain, get_env(domain).factory, _tasks(domain, tasks.get(domain), args.limit),
                           parse_spec(text), weight)
            )  # fmt: skip
        reports = distill(
            specialists, args.out, samples=args.samples, prompt=args.prompt, max_steps=args.max_steps,
            workers=args.workers, seed=args.seed, overwrite=args.overwrite,
        )  # fmt: skip
        print(json.dumps({"out": args.out, "domains": {d: asdict(r) for d, r in reports.items()}}))
        return 0

    command(q, run)


def add_rl(psub: argparse._SubParsersAction) -> None:
    q = psub.add_parser(
        "rl", help="mixed agentic GRPO: multi-turn episodes in environments (+ single-turn domains)"
    )
    q.add_argument(
        "config",
        nargs="?",
        help="TOML recipe: an agentic GRPO recipe ([agentic], [[envs]] and the rl sections) or the "
        "post-training recipe (configs/posttrain-smollm2.toml: its [tasks] and [rl])",
    )
    q.add_argument("--policy", help="a model that speaks V3.2 (an sft output dir, a native checkpoint)")
    q.add_argument("--out", help="output directory (default: the recipe's out_dir)")
    q.add_argument("--steps", type=positive_int)
    q.add_argument(
        "--prompts-per-step", type=positive_int, help="tasks drawn per step (grpo.prompts_per_step)"
    )
    q.add_argument("--group-size", type=positive_int, help="episodes per task, G (grpo.group_size; >= 2)")
    q.add_argument(
        "--eval-tasks",
        type=non_negative_int,
        help="held-out tasks per environment (agentic.eval_tasks; 0: none)",
    )
    q.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    q.add_argument("--no-resume", action="store_true", help="start over even if checkpoints exist")
    q.add_argument("--no-progress", action="store_true")

    def run(args: argparse.Namespace) -> int:
        from dsv32 import distributed
        from dsv32.rl.agentic.config import work_plan
        from dsv32.rl.agentic.trainer import check_agentic_world, train_agentic, v32_policy

        cfg, heldout, write = rl_recipe(args)
        w = distributed.setup()  # under torchrun: every rank checks, rank 0 alone prints and writes
        check_agentic_world(cfg, w)
        plan = work_plan(cfg, heldout, resumed_step(cfg, not args.no_resume))
        if w.main:
            print(f"dsv32 posttrain rl: {plan}", flush=True)
        policy = None
        if write is not None:  # the generated tasks are written once the policy has loaded
            policy = v32_policy(cfg)
            if w.main:
                write()
            distributed.barrier()
        result = train_agentic(cfg, policy=policy, resume=not args.no_resume, progress=not args.no_progress)
        if w.main:
            print(result.summary())
        return 0

    command(q, run)


#: ``posttrain rl`` flags → the recipe keys they set (in an agentic GRPO recipe).
RL_FLAGS = {
    "policy": "policy.name",
    "steps": "grpo.steps",
    "prompts_per_step": "grpo.prompts_per_step",
    "group_size": "grpo.group_size",
    "eval_tasks": "agentic.eval_tasks",
    "out": "out_dir",
}


def rl_recipe(args: argparse.Namespace):
    """``(config, held-out task count, write)`` for ``posttrain rl``: from an agentic GRPO recipe
    (``write`` None), or from the ``[tasks]`` and ``[rl]`` of the post-training recipe, whose flags
    then set ``rl.*`` and whose generated tasks ``write()`` saves into ``out_dir``."""
    from dsv32.cli.posttrain_recipe import is_posttrain_recipe, read_posttrain_recipe
    from dsv32.recipe import read_recipe
    from dsv32.rl.agentic.config import heldout_count, load_agentic_config
    from dsv32.rl.grpo.config import RLConfigError

    if args.config is None or not is_posttrain_recipe(read_recipe(args.config, error=RLConfigError)):
        cfg = load_agentic_config(args.config, flag_overrides(args, RL_FLAGS))
        return cfg, heldout_count(cfg), None
    keys = {flag: key if flag == "out" else f"rl.{key}" for flag, key in RL_FLAGS.items()}
    recipe = read_posttrain_recipe(args.config, flag_overrides(args, keys))
    if recipe.tasks.rl_pool != "all":
        print(
            f"dsv32 posttrain rl: [tasks] rl_pool = {recipe.tasks.rl_pool!r} is a stage of the proof "
            "(after its SFT evaluation); this run draws from every training task",
            flush=True,
        )
    train, heldout = recipe.generate_tasks()
    evaluated = min(len(heldout), recipe.rl.agentic.eval_tasks)
    return recipe.rl, evaluated, lambda: recipe.write_tasks(train, heldout)


def resumed_step(cfg, resume: bool) -> int:
    """The step a run resumes after (its newest checkpoint's), 0 when it starts over."""
    from dsv32.runlog import StepCheckpoints

    done = StepCheckpoints(cfg.rl.out_dir).complete() if resume else []
    return min(done[-1][0], cfg.rl.grpo.steps) if done else 0


def add_proof(psub: argparse._SubParsersAction) -> None:
    q = psub.add_parser(
        "proof",
        help="base → cold-start SFT → agentic GRPO on held-out code-interpreter tasks; report.{json,md,png}",
    )
    q.add_argument(
        "config", nargs="?", default=None, help="TOML recipe (default: configs/posttrain-smollm2.toml)"
    )
    q.add_argument("--out", help="output directory (default: the recipe's out_dir)")
    q.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    q.add_argument("--no-progress", action="store_true")

    def run(args: argparse.Namespace) -> int:
        report = run_proof(args.config, args.set, args.out, progress=not args.no_progress)
        print(json.dumps({k: v for k, v in report.items() if k != "details"}))
        return 0

    command(q, run)


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "posttrain",
        help="V3.2 post-training: cold-start data, specialist distillation, agentic GRPO, the proof",
    )
    psub = p.add_subparsers(dest="posttrain_cmd", metavar="COMMAND", required=True)
    add_cold_start(psub)
    add_distill(psub)
    add_rl(psub)
    add_proof(psub)
