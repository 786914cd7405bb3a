"""The three synthesis runs behind ``dsv32 synth general|search|filter``: each builds its jobs,
checks every input before the output directory is created, and runs them through
:func:`dsv32.synth.runner.run_jobs` (concurrent, resumable, deduplicated, costed)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from dsv32.synth.backends import BackendSpec
from dsv32.synth.records import SynthError, provenance
from dsv32.synth.runner import Store, run_jobs

log = logging.getLogger(__name__)


def _check_workers(specs: list[BackendSpec], workers: int) -> None:
    """Local models run one episode at a time, and are loaded now: a bad name fails before any output."""
    if workers > 1 and any(s.kind == "local" for s in specs):
        raise SynthError(
            "a local model runs one episode at a time; use --workers 1 (or serve it: dsv32 serve)"
        )
    for spec in specs:
        if spec.kind == "local":
            spec.make()


def _progress(row: dict) -> None:
    log.info("%s: %s%s", row["key"], row["status"], f" {len(row['kept'])} kept" if row["kept"] else "")


def run_general(
    categories: list[str], episodes: int, generator: BackendSpec, out: str | Path, *, workers: int = 1,
    on_result: Callable[[dict], None] | None = _progress, **options,
) -> dict:  # fmt: skip
    """``episodes`` synthesis episodes per category; ``options`` are :class:`GeneralConfig` fields."""
    from dsv32.synth.general import GeneralConfig, slug, synthesize

    if episodes < 1:
        raise SynthError(f"episodes must be at least 1, got {episodes}")
    options = {**options, "sampling": {**generator.sampling, **options.get("sampling", {})}}
    options["thinking"] = options.get("thinking", True) and generator.thinking
    if generator.max_steps:
        options["max_steps"] = generator.max_steps
    configs: dict[str, GeneralConfig] = {}
    for category in categories:  # a job key is the slug, so two categories may not share one
        name = slug(category)
        if name in configs and configs[name].category != category:
            raise SynthError(
                f"the categories {configs[name].category!r} and {category!r} have the same job name "
                f"{name!r} (lower-case letters and digits, the first 40 characters); make them differ there"
            )
        configs[name] = GeneralConfig(category, **options)
    if not configs:
        raise SynthError("name at least one task category (--category)")
    if any(c.corpus not in (None, "stdlib") and not Path(c.corpus).is_file() for c in configs.values()):
        raise SynthError("the search corpus must be 'stdlib' or an existing JSONL file of id/title/text rows")
    _check_workers([generator], workers)
    settings = {
        "categories": categories,
        "episodes": episodes,
        **{k: v for k, v in options.items() if k != "limits"},
    }
    store = Store(
        out, "general", provenance({"generator": generator.label}, settings), scope=("categories", "episodes")
    )

    def work(key: str, store: Store):
        config = configs[key.rsplit("-", 1)[0]]
        return synthesize(generator.make(), config, key, store.staging(key), pricing=generator.pricing,
                          provenance=store.provenance, retry_errors=generator.kind != "local")  # fmt: skip

    keys = [f"{s}-{i:05d}" for s in configs for i in range(episodes)]
    with store:
        return run_jobs(keys, work, store, workers=workers, on_result=on_result)


def run_search(
    entities: int, constructor: BackendSpec, answerers: list[BackendSpec], verifier: BackendSpec,
    out: str | Path, *, rubric: BackendSpec | None = None, workers: int = 1, max_mentions: int = 3,
    on_result: Callable[[dict], None] | None = _progress, **options,
) -> dict:  # fmt: skip
    """Search-QA synthesis over ``entities`` long-tail entities; ``options`` are :class:`SearchQAConfig` fields."""
    from dsv32.envs.search import shared_index
    from dsv32.synth.general import slug
    from dsv32.synth.searchqa import SearchQAConfig, sample_entities, synthesize_qa

    if entities < 1:
        raise SynthError(f"entities must be at least 1, got {entities}")
    if not answerers:
        raise SynthError("give at least one answer agent (--answerer)")
    config = SearchQAConfig(**options)
    rubric = rubric or verifier
    _check_workers([constructor, *answerers, verifier, rubric], workers)
    picked = sample_entities(shared_index(config.corpus), entities, config.seed, max_mentions)
    by_key = {f"{i:05d}-{slug(doc.id)}": doc for i, doc in enumerate(picked)}
    generators = {"constructor": constructor.label, "verifier": verifier.label, "rubric": rubric.label}
    generators.update({f"answerer{i}": a.label for i, a in enumerate(answerers)})
    settings = {**asdict(config), "entities": entities, "max_mentions": max_mentions,
                "answerers": [a.text.split(",")[0] + f" {a.sampling} prompt={a.prompt}" for a in answerers]}  # fmt: skip
    store = Store(out, "search", provenance(generators, settings), scope=("entities",))

    def work(key: str, store: Store):
        return synthesize_qa(
            by_key[key], key, constructor=constructor.agent("constructor", 30),
            answerers=[a.agent(f"a{i}", 12) for i, a in enumerate(answerers)],
            verifier=verifier.agent("verifier", 20), rubric_writer=rubric.agent("rubric", 1), config=config,
        )  # fmt: skip

    with store:
        return run_jobs(list(by_key), work, store, workers=workers, on_result=on_result)


def run_filter(
    env: str, tasks: str | None, policy: BackendSpec, out: str | Path, *, workers: int = 1,
    limit: int | None = None, env_options: dict | None = None,
    on_result: Callable[[dict], None] | None = _progress, **options,
) -> dict:  # fmt: skip
    """pass@k filtering of an environment's tasks; ``options`` are :class:`FilterConfig` fields. Writes
    ``report.json`` and ``report.md`` (the distribution) beside the run's files."""
    import json

    from dsv32.envs.base import get_env, resolve_tasks
    from dsv32.synth.filter import FilterConfig, distribution, report_markdown, score_task

    config = FilterConfig(**options)
    config.max_steps = policy.max_steps or config.max_steps
    config.thinking = config.thinking and policy.thinking
    config.sampling = {**policy.sampling, **config.sampling}
    spec = get_env(env)
    chosen = resolve_tasks(env, tasks)
    if limit is not None:
        if limit < 1:
            raise SynthError(f"limit must be at least 1, got {limit}")
        chosen = chosen[:limit]
    env_options = dict(env_options or {})
    try:  # a bad environment option fails here, before anything is written
        spec.factory(**env_options).close()
    except TypeError as err:
        raise SynthError(
            f"environment {env!r} does not take the option(s) {sorted(env_options)}: {err}"
        ) from None
    _check_workers([policy], workers)
    by_key = {t.id: t for t in chosen}
    settings = {**asdict(config), "env": env, "tasks": tasks, "limit": limit, "env_options": env_options}
    store = Store(out, "filter", provenance({"policy": policy.label}, settings), artifacts=None,
                  scope=("limit",), owned=("report.json", "report.md"))  # fmt: skip
    backends: dict[int, object] = {}

    def work(key: str, store: Store):
        import threading

        thread = threading.get_ident()
        if thread not in backends:  # one backend per worker thread
            backends[thread] = policy.make()
        backend = backends[thread]
        return score_task(
            backend, lambda: spec.factory(**env_options), by_key[key], config, key, policy.pricing,
            retry_errors=policy.kind != "local",
        )  # fmt: skip

    with store:
        summary = run_jobs(list(by_key), work, store, workers=workers, on_result=on_result)
        dist = distribution(store.results, config.k)
        summary["distribution"] = dist
        (store.out / "report.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
        (store.out / "report.md").write_text(
            report_markdown(dist, config.k, f"{env} / {policy.label}"), encoding="utf-8"
        )
    return summary
