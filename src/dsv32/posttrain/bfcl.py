"""BFCL single-turn on the model being post-trained, in memory, through ``dsv32 eval``: the same
problems, prompts (the local backend's V3.2 encoding, the functions as V3.2's tools block — the
format the cold start taught), greedy decoding and BFCL's own AST checker as ``dsv32 eval run bfcl
--backend local``, with the model handed over instead of loaded from a directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsv32.eval import RunSettings, run
from dsv32.eval.bfcl.single import decode_calls
from dsv32.eval.samples import read_samples
from dsv32.eval.solvers import Generated, LocalSolver
from dsv32.eval.types import Problem


class ModelSolver(LocalSolver):
    """``dsv32 eval``'s local solver over a model already in memory. It also keeps, per problem,
    whether the reply's tool use was well formed: it parsed as V3.2 without a problem, made at least
    one call, and every call named an offered function with a JSON object of arguments."""

    def __init__(self, model: Any, tokenizer: Any, name: str, batch_size: int = 8) -> None:
        from dsv32.agent import LocalBackend

        self.name = name
        self.chunk_size = batch_size
        self.backend = LocalBackend(model, tokenizer)
        self.window = self.backend.window
        self.well_formed: dict[str, bool] = {}  # problem id → well-formed tool use, in problem order

    def complete(self, items: list[tuple[Problem, int]], settings: RunSettings) -> list[Generated]:
        replies = super().complete(items, settings)
        for (problem, _), reply in zip(items, replies):
            offered = {t["function"]["name"] for t in problem.tools}
            calls, _ = decode_calls(reply.message)
            self.well_formed[problem.id] = (
                not reply.problems and bool(calls) and all(next(iter(c)) in offered for c in calls)
            )
        return replies


def evaluate_bfcl(
    model: Any,
    tokenizer: Any,
    categories: list[str],
    per_category: int,
    out: Path,
    *,
    name: str,
    max_tokens: int,
    batch_size: int,
    thinking: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """The first ``per_category`` entries of each BFCL category, greedy (``dsv32 eval``'s run
    directories under ``out/<category>``, started afresh). Returns ``episodes`` (entries scored),
    ``accuracy``, ``tool_call_valid``, ``by_category`` and ``outcomes`` (``id``, ``category``,
    ``correct``, ``tool_call_valid``, in entry order). The model's train/eval mode is restored."""
    was_training = model.training
    solver = ModelSolver(model, tokenizer, name, batch_size)
    outcomes, by_category = [], {}
    try:
        for category in categories:
            settings = RunSettings(
                "bfcl", backend="local", model=name, subset=[category], limit=per_category, temperature=0.0,
                max_tokens=max_tokens, thinking=thinking, batch_size=batch_size,
            )  # fmt: skip
            results = run(settings, out / category, fresh=True, progress=progress, solver=solver)
            order = {pid: i for i, pid in enumerate(solver.well_formed)}
            rows = sorted(
                (r for r in read_samples(out / category / "samples.jsonl") if r["sample"] == 0),
                key=lambda r: order.get(r["id"], len(order)),
            )
            part = [
                {"id": r["id"], "category": category, "correct": r["score"] == 1.0,
                 "tool_call_valid": solver.well_formed.get(r["id"], False)}
                for r in rows
            ]  # fmt: skip
            outcomes += part
            by_category[category] = {
                "entries": len(part),
                "accuracy": sum(o["correct"] for o in part) / len(part),
                "excluded": len(results.get("excluded") or {}),
                "endings": results.get("endings", {}),
            }
    finally:
        model.train(was_training)
    n = len(outcomes)
    return {
        "episodes": n,
        "accuracy": sum(o["correct"] for o in outcomes) / n,
        "tool_call_valid": sum(o["tool_call_valid"] for o in outcomes) / n,
        "by_category": by_category,
        "outcomes": outcomes,
    }


def count_entries(categories: list[str], per_category: int) -> int:
    """How many BFCL entries a run scores (the first ``per_category`` answerable entries of each
    category); reads the ``bfcl-eval`` package's data, loads no model (raises
    :class:`~dsv32.eval.EvalError` when the package is missing)."""
    from dsv32.eval import registry

    bench = registry.get("bfcl")
    return sum(len(bench.problems([c])[:per_category]) for c in categories)
