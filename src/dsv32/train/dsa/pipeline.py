"""What the ``dsv32 dsa`` commands and ``dsv32 demo`` run: load → data → stage(s) → evaluation.

``run_demo`` is the project's main job (``make demo``): SmolLM2-135M-Instruct → attach DSA → dense
warm-up → a short sparse stage → evaluation at 2048 tokens, top-256, with the untrained indexer
beside it; it prints the Markdown report and writes ``runs/demo/dsa_report.json``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from dsv32 import distributed
from dsv32.trackers import require
from dsv32.train.dsa.config import RunConfig, StageConfig, TrainConfigError
from dsv32.train.dsa.data import Document, TokenData, exclude_documents, list_documents, load_token_data
from dsv32.train.dsa.models import DSAModel, load_dsa_model
from dsv32.train.dsa.trainer import StageResult, train_stage

logger = logging.getLogger(__name__)


def demo_config() -> RunConfig:
    """The main job's recipe, ``configs/smollm2-demo.toml`` (shipped with the package as
    ``dsv32/configs/``), sized for ~12 minutes on a 2-core CPU; the file's comments give each
    deviation from the paper and why."""
    from importlib.resources import files

    from dsv32.train.dsa.config import load_run_config

    return load_run_config(files("dsv32") / "configs" / "smollm2-demo.toml")


def unique_sequences(cfg: StageConfig) -> int:
    """Distinct training sequences a stage reads."""
    total = cfg.steps * cfg.sequences_per_step
    if cfg.stage == "warmup" and cfg.replay > 1:
        pools = math.ceil(total / (cfg.replay_pool * cfg.replay))
        return pools * cfg.replay_pool
    return total


def prepare_data(
    cfg: RunConfig,
    dm: DSAModel,
    stages: list[StageConfig],
    eval_sequences: bool = False,
    docs: list[Document] | None = None,
) -> TokenData:
    """Tokenize just enough text for ``stages`` and (``eval_sequences``) the held-out sequences of
    each evaluation length (:meth:`~dsv32.train.dsa.config.EvalConfig.sequences_at`). ``docs``: ``cfg.data``'s documents, listed before the model was loaded (so a
    bad source fails before the wait)."""
    if dm.tokenizer is None:
        raise TrainConfigError(
            f"model {dm.source!r} has no tokenizer: text data needs one (save one beside its weights)"
        )
    L = cfg.data.seq_len
    need = max([unique_sequences(s) * (s.seq_len or L) for s in stages] or [L])
    counts = {n: cfg.eval.sequences_at(n) if eval_sequences else 0 for n in cfg.eval.seq_lens}
    eval_tokens = max([n * c for n, c in counts.items()] + [L]) + 1
    return load_token_data(cfg.data, dm.tokenizer, need + 1, eval_tokens, docs=docs)


def eval_sequences(data: TokenData, cfg: RunConfig) -> dict[int, torch.Tensor]:
    out = {}
    for L in cfg.eval.seq_lens:
        seqs = data.eval_sequences(L, cfg.eval.sequences_at(L))
        if seqs.shape[0] == 0:
            raise TrainConfigError(
                f"the held-out split has fewer than {L} tokens: lower eval.seq_lens or add text"
            )
        out[L] = seqs
    return out


def check_lengths(cfg: RunConfig, dm: DSAModel, eval_only: bool = False) -> None:
    """Sequence lengths must fit the model's position limit (checked before anything is written)."""
    limit = getattr(dm.model.config, "max_position_embeddings", None)
    if not limit:
        return
    lengths = {"eval.seq_lens": max(cfg.eval.seq_lens)}
    if not eval_only:
        lengths["data.seq_len"] = cfg.data.seq_len
        for stage in (cfg.warmup, cfg.sparse):
            if stage.seq_len:
                lengths[f"{stage.stage}.seq_len"] = stage.seq_len
    for key, length in lengths.items():
        if length > limit:
            raise TrainConfigError(f"{key} = {length} exceeds the model's max_position_embeddings ({limit})")


def run_identity(cfg: RunConfig) -> dict:
    """What determines a stage's training besides its own section: the model (name, dtype), the DSA
    settings and the data (all but the held-out budget), as recipe sections."""
    data = {k: v for k, v in asdict(cfg.data).items() if k != "max_eval_tokens"}
    return {
        "model": {"name": cfg.model.name, "dtype": cfg.model.dtype},
        "dsa": cfg.dsa.to_dict(),
        "data": data,
    }


def run_stage(
    cfg: RunConfig,
    stage: str,
    out_dir: str | Path | None = None,
    progress: bool = True,
    resume: bool = True,
) -> StageResult:
    """``dsv32 dsa warmup|sparse``: load ``cfg.model``, train one stage, save ``out_dir/model``.
    ``resume``: continue the run in ``out_dir`` when its checkpoint has this recipe's settings
    (a :class:`~dsv32.runlog.CheckpointError` when it has others); False: start over."""
    stage_cfg = cfg.warmup if stage == "warmup" else cfg.sparse
    out = Path(out_dir or Path(cfg.out_dir) / stage)
    # under torchrun: join the process group (and pick this rank's GPU) before the model loads; a
    # step that does not split over the ranks fails on every rank before anything is read
    distributed.rank_share(stage_cfg.grad_accum, stage_cfg.batch_size, distributed.setup())
    require(cfg.report_to)  # a tracker that is not installed stops the run before the model loads
    docs = list_documents(cfg.data)
    dm = load_dsa_model(cfg.model, cfg.dsa)
    check_lengths(cfg, dm)
    data = prepare_data(cfg, dm, [stage_cfg], docs=docs)
    logger.info(
        "%s: %s, %d train sequences of %d tokens from %r", stage, dm.source, data.train_sequences().shape[0],
        data.seq_len, data.source,
    )  # fmt: skip
    return train_stage(
        dm, data, stage_cfg, out, progress=progress, resume=resume, run=run_identity(cfg),
        report_to=cfg.report_to, config=cfg.to_dict(),
    )  # fmt: skip


def run_eval(cfg: RunConfig, out_dir: str | Path | None = None, progress: bool = True) -> dict:
    """``dsv32 dsa eval``: evaluate ``cfg.model`` and write the report under ``out_dir``."""
    from dsv32.train.dsa.evaluate import evaluate_dsa
    from dsv32.train.dsa.report import report_dict, write_report

    out = Path(out_dir or Path(cfg.out_dir) / "eval")
    docs = list_documents(cfg.data)
    dm = load_dsa_model(cfg.model, cfg.dsa)
    check_lengths(cfg, dm, eval_only=True)
    data = prepare_data(cfg, dm, [], eval_sequences=True, docs=docs)
    points = evaluate_dsa(
        dm,
        eval_sequences(data, cfg),
        cfg.eval.topks,
        batch_size=cfg.eval.batch_size,
        untrained=cfg.eval.untrained,
        recall=cfg.eval.recall,
        oracle=cfg.eval.oracle,
        progress=progress,
    )
    report = report_dict(points, indexer=indexer_label(dm.source), model=dm.source, data=data.source)
    md = write_report(out, report, points, title=f"DSA evaluation of {dm.source}")
    print(md.read_text())
    return report


def run_demo(cfg: RunConfig | None = None, progress: bool = True) -> dict:
    """The main job (and any recipe of its shape, e.g. ``configs/smollm2-dsa-long.toml``): warm-up,
    evaluation, sparse stage, evaluation again — of the adaptation domain's held-out text and, with
    ``eval.off_domain``, of a source held out whole. Returns the report dict (also
    ``<out_dir>/dsa_report.json``)."""
    from dsv32.train.dsa.report import report_dict, write_report

    distributed.require_one_process("dsv32 demo")  # runs both stages on one model in one process
    cfg = cfg or demo_config()
    require(cfg.report_to)
    out = Path(cfg.out_dir)
    timings: dict[str, float] = {}
    t = time.time()
    docs = list_documents(cfg.data)
    off_docs: list[Document] = []
    if cfg.eval.off_domain:
        off_docs = list_documents(replace(cfg.data, source=cfg.eval.off_domain))
        docs = exclude_documents(docs, off_docs)
        if not docs:
            raise TrainConfigError(
                f"eval.off_domain = {cfg.eval.off_domain!r} holds out every document of data.source "
                f"{cfg.data.source!r}: nothing is left to train on"
            )
    dm = load_dsa_model(cfg.model, cfg.dsa)
    check_lengths(cfg, dm)
    timings["load"] = time.time() - t
    t = time.time()
    data = prepare_data(cfg, dm, [cfg.warmup, cfg.sparse], eval_sequences=True, docs=docs)
    held = {"in_domain": eval_sequences(data, cfg)}
    if off_docs:
        held["off_domain"] = off_domain_sequences(cfg, dm, off_docs)
    timings["data"] = time.time() - t
    logger.info(
        "demo: %s with DSA (%d indexer heads × %d, top-%d) on %r: %d train / %d held-out tokens",
        dm.source, cfg.dsa.index_n_heads, cfg.dsa.index_head_dim, cfg.dsa.index_topk, data.source,
        data.train_stream.numel(), data.eval_stream.numel(),
    )  # fmt: skip

    t = time.time()
    warm = train_stage(
        dm, data, cfg.warmup, out / "warmup", resume=False, progress=progress, run=run_identity(cfg),
        report_to=cfg.report_to, config=cfg.to_dict(),
    )  # fmt: skip
    timings["warmup"] = time.time() - t
    t = time.time()
    first = cfg.eval.after_warmup == "first"  # the adaptation domain's first point only
    after_warmup = {
        domain: evaluate_grid(
            dm, seqs, cfg, untrained=cfg.eval.untrained and domain == "in_domain", progress=progress,
            first_only=first,
        )
        for domain, seqs in held.items()
        if domain == "in_domain" or not first
    }  # fmt: skip
    points = after_warmup["in_domain"]
    timings["eval_after_warmup"] = time.time() - t

    t = time.time()
    sparse = train_stage(
        dm, data, cfg.sparse, out / "sparse", resume=False, progress=progress, run=run_identity(cfg),
        report_to=cfg.report_to, config=cfg.to_dict(),
    )  # fmt: skip
    timings["sparse"] = time.time() - t
    t = time.time()
    after_sparse_points = {
        domain: evaluate_grid(dm, seqs, cfg, untrained=False, progress=progress)
        for domain, seqs in held.items()
    }
    timings["eval_after_sparse"] = time.time() - t

    head, after = points[0], after_sparse_points["in_domain"][0]
    after_sparse = {
        "steps": sparse.steps,
        "ppl_dsa": after.ppl_dsa,
        "ppl_dense": after.ppl_dense,
        "ppl_dsa_oracle": after.ppl_dsa_oracle,
        "attention_recall": after.attention_recall,
        "attention_recall_oracle": after.attention_recall_oracle,
        "ppl_gap_same_model": after.ppl_gap,
        "ppl_gap_vs_original": after.ppl_dsa / head.ppl_dense - 1,
        "gap_change_same_model": after.ppl_gap - head.ppl_gap,
    }
    timings["total"] = sum(timings.values())
    sources = {"in_domain": data.source, "off_domain": cfg.eval.off_domain}
    domains = {
        domain: {
            "source": sources[domain],
            "sequences": {str(L): int(seqs.shape[0]) for L, seqs in held[domain].items()},
            "after_warmup": [p.to_dict() for p in after_warmup.get(domain, [])],
            "after_sparse": [p.to_dict() for p in after_sparse_points[domain]],
        }
        for domain in held
    }
    report = report_dict(
        points,
        indexer=STAGE_LABELS["warmup"],
        model=dm.source,
        data=data.source,
        dsa=cfg.dsa.to_dict(),
        after_sparse=after_sparse,
        **final_keys(after_sparse_points),
        minutes=timings["total"] / 60,
        domains=domains,
        stages={"warmup": _stage_summary(warm), "sparse": _stage_summary(sparse)},
        timings=timings,
    )
    md = write_report(
        out, report, points, title="DSA demo: SmolLM2-135M-Instruct → DeepSeek Sparse Attention"
    )
    print(md.read_text())
    return report


def off_domain_sequences(cfg: RunConfig, dm: DSAModel, docs: list[Document]) -> dict[int, torch.Tensor]:
    """The held-out sequences of every evaluation length from ``eval.off_domain``'s text."""
    from dsv32.train.dsa.data import held_out_stream

    need = max(L * cfg.eval.sequences_at(L) for L in cfg.eval.seq_lens)
    stream = held_out_stream(docs, cfg.data, dm.tokenizer, need)
    out = {}
    for L in cfg.eval.seq_lens:
        n = min(cfg.eval.sequences_at(L), stream.numel() // L)
        if n == 0:
            raise TrainConfigError(
                f"eval.off_domain = {cfg.eval.off_domain!r} gives {stream.numel()} tokens: fewer than one "
                f"sequence of {L}"
            )
        out[L] = stream[: n * L].view(n, L)
    return out


def evaluate_grid(dm: DSAModel, sequences: dict[int, torch.Tensor], cfg: RunConfig, *, untrained: bool,
                  progress: bool, first_only: bool = False) -> list:  # fmt: skip
    """:func:`~dsv32.train.dsa.evaluate.evaluate_dsa` at every point of ``cfg.eval.grid()`` (its first
    point only: ``first_only``)."""
    from dsv32.train.dsa.evaluate import evaluate_dsa

    points = []
    grid = cfg.eval.grid()
    for L, topks in [(grid[0][0], grid[0][1][:1])] if first_only else grid:
        points += evaluate_dsa(
            dm, {L: sequences[L]}, topks, batch_size=cfg.eval.batch_size, untrained=untrained,
            recall=cfg.eval.recall, oracle=cfg.eval.oracle, progress=progress,
        )  # fmt: skip
    return points


def final_keys(after_sparse: dict[str, list]) -> dict[str, float | None]:
    """The report's headline numbers after the sparse stage: for the first evaluation point,
    ``final_ppl_gap_same_model`` (DSA against the same weights dense), ``final_attention_recall``
    (and the oracle's) and ``oracle_ppl_gap`` (the oracle top-k against dense); the same for every
    other point with its length as a suffix (``…_8k``), and for the off-domain text with
    ``_off_domain``."""
    out: dict[str, float | None] = {}
    for domain, points in after_sparse.items():
        tail = "" if domain == "in_domain" else f"_{domain}"
        used: set[str] = set()
        for i, p in enumerate(points):
            tag = "" if i == 0 else f"_{p.seq_len // 1024}k" if p.seq_len % 1024 == 0 else f"_{p.seq_len}"
            if tag in used:
                tag += f"_top{p.topk}"
            used.add(tag)
            oracle = None if p.ppl_dsa_oracle is None else p.ppl_dsa_oracle / p.ppl_dense - 1
            out[f"final_ppl_gap_same_model{tag}{tail}"] = p.ppl_gap
            out[f"final_attention_recall{tag}{tail}"] = p.attention_recall
            out[f"final_attention_recall_oracle{tag}{tail}"] = p.attention_recall_oracle
            out[f"oracle_ppl_gap{tag}{tail}"] = oracle
    return out


#: What a stage's saved model holds, as the report names its indexer.
STAGE_LABELS = {"warmup": "indexer after the warm-up", "sparse": "model and indexer after the sparse stage"}


def indexer_label(source: str) -> str:
    """How the report names the indexer of the model at ``source``: a stage's output
    (``<out>/<stage>/model``, beside the stage's ``stage.json``) by that stage, anything else as the
    model's own."""
    from dsv32.jsonl import read_json
    from dsv32.train.dsa.report import INDEXER

    stage_file = Path(source).parent / "stage.json"
    if Path(source).name != "model" or not stage_file.is_file():
        return INDEXER
    try:
        meta = read_json(stage_file, TrainConfigError)
    except (OSError, TrainConfigError):
        return INDEXER
    return STAGE_LABELS.get(meta.get("stage") if isinstance(meta, dict) else None, INDEXER)


def _stage_summary(result: StageResult) -> dict:
    last = result.metrics[-1] if result.metrics else {}
    first = result.metrics[0] if result.metrics else {}
    return {
        "steps": result.steps,
        "tokens": last.get("tokens"),
        "loss_indexer_first": first.get("loss_indexer"),
        "loss_indexer": last.get("loss_indexer"),
        "loss_lm_first": first.get("loss_lm"),
        "loss_lm": last.get("loss_lm"),
        "seconds": result.seconds,
    }


# The small random test models: they have no tokenizer, so the commands (text data) cannot use them.
NO_TOKENIZER = ("tiny-llama", "tiny-native")


def config_from_cli(command: str, args: dict) -> tuple[RunConfig, Path | None]:
    """The recipe of ``dsv32 dsa <command>`` / ``dsv32 demo``: ``--config`` (else the demo recipe for
    ``demo``, the defaults otherwise), then the shortcut flags, then ``--set`` overrides. Returns the
    config and the output directory (None: the command's default under ``out_dir``).

    Without ``--model``, ``sparse`` starts from ``<out_dir>/warmup/model`` and ``eval`` reads
    ``<out_dir>/sparse/model`` (else the warm-up's) when they exist."""
    from dsv32.recipe import apply_override, out_dir_problem
    from dsv32.train.dsa.config import load_run_config, run_config_from_dict

    if args.get("config"):
        cfg = load_run_config(args["config"])
    elif command == "demo":
        cfg = demo_config()
    else:
        cfg = RunConfig()
    data = cfg.to_dict()
    stage = command if command in ("warmup", "sparse") else None
    shortcuts = {
        "model": ["model.name"],
        "data": ["data.source"],
        "seq_len": ["data.seq_len"] + (["eval.seq_lens"] if command == "eval" else []),
        "topk": ["dsa.index_topk", "sparse.index_topk"] + (["eval.topks"] if command == "eval" else []),
        "steps": [f"{stage}.steps"] if stage else [],
        "lr": [f"{stage}.lr"] if stage else [],
    }
    for flag, keys in shortcuts.items():
        value = args.get(flag)
        if value is None:
            continue
        for key in keys:
            section, name = key.split(".")
            data[section][name] = [value] if name in ("seq_lens", "topks") else value
    if args.get("report_to") is not None:
        data["report_to"] = args["report_to"]
    for item in args.get("set") or []:
        apply_override(data, item, TrainConfigError)
    for section in ("warmup", "sparse"):  # keep a stage's lr unset → the paper's default for its stage
        if data[section].get("lr") is None:
            data[section].pop("lr", None)
    cfg = run_config_from_dict(data)
    if cfg.model.name in NO_TOKENIZER:
        raise TrainConfigError(
            f"[model] name = {cfg.model.name!r}: a random test model without a tokenizer cannot read text "
            "data; use smollm2, a Hugging Face model directory or hub id, a stage output or a native "
            "V3.2 checkpoint (from Python, tiny models train on token tensors: TokenData.from_sequences)"
        )
    if args.get("model") is None and not any(s.startswith("model.name=") for s in args.get("set") or []):
        root = Path(cfg.out_dir)
        previous = {"sparse": ["warmup"], "eval": ["sparse", "warmup"]}.get(command, [])
        for name in previous:
            candidate = root / name / "model"
            if candidate.is_dir():
                logger.info("dsv32 dsa %s: using %s (pass --model to choose)", command, candidate)
                cfg.model.name = str(candidate)
                break
        else:
            if previous:
                logger.warning(
                    "dsv32 dsa %s: no %s under %s, so this starts from %s with untrained indexers "
                    "(run `dsv32 dsa warmup` first, or pass --model)",
                    command, " or ".join(f"{name}/model" for name in previous), root, cfg.model.name,
                )  # fmt: skip
    out = Path(args["out"]) if args.get("out") else None
    problem = out_dir_problem(out) if out is not None else None
    if problem:
        raise TrainConfigError(f"--out {out}: cannot be the output directory: {problem}")
    if command == "demo" and out is not None:
        cfg.out_dir = str(out)
    return cfg, out
