"""BFCL's group scores (its leaderboard columns) from per-category accuracies: pinned against
bfcl-eval's own aggregation functions, and on a full run of a model that never calls a function."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from dsv32.eval import RunSettings, registry, run
from dsv32.eval.bfcl.groups import group_scores
from dsv32.eval.report import render
from dsv32.eval.solvers import Generated, ReferenceSolver

CATEGORIES = {
    "simple_python": (0.9, 400),
    "multiple": (0.8, 200),
    "parallel": (0.5, 200),
    "parallel_multiple": (0.6, 200),
    "live_simple": (0.7, 258),
    "live_multiple": (0.4, 1053),
    "live_parallel": (0.25, 16),
    "live_parallel_multiple": (0.5, 24),
    "irrelevance": (0.95, 240),
    "live_irrelevance": (0.3, 884),
    "live_relevance": (0.75, 16),
    "multi_turn_base": (0.6, 200),
    "multi_turn_miss_func": (0.2, 150),
    "multi_turn_miss_param": (0.4, 180),
    "multi_turn_long_context": (0.1, 200),
}


def bfcl_eval_functions() -> dict:
    """bfcl-eval's calculate_{weighted,unweighted}_accuracy, taken from the installed package's
    source (its module imports pandas, which the eval environment does not need)."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None:
        pytest.skip("bfcl-eval is not installed")
    source = Path(spec.submodule_search_locations[0]) / "eval_checker" / "eval_runner_helper.py"
    wanted = {"calculate_weighted_accuracy", "calculate_unweighted_accuracy"}
    tree = ast.parse(source.read_text())
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    namespace: dict = {}
    exec(compile(ast.Module(nodes, []), str(source), "exec"), namespace)
    return namespace


def test_simple_is_the_unweighted_mean_of_python_java_and_javascript():
    fns = bfcl_eval_functions()
    unweighted = fns["calculate_unweighted_accuracy"]
    three = {"simple_python": (0.9, 400), "simple_java": (0.3, 98), "simple_javascript": (0.6, 50)}
    rest = {c: CATEGORIES[c] for c in ("multiple", "parallel", "parallel_multiple")}
    mine = group_scores({**three, **rest})["non_live_ast"]

    def cat(name, table):
        a, n = table[name]
        return {"accuracy": a, "total_count": n, "display_accuracy": a}

    simple = unweighted([cat(c, three) for c in three])
    expected = unweighted([simple, *(cat(c, rest) for c in rest)])
    assert mine["accuracy"] == pytest.approx(expected["accuracy"]) and mine["missing"] == []


def test_groups_match_bfcl_eval_functions():
    fns = bfcl_eval_functions()
    weighted, unweighted = fns["calculate_weighted_accuracy"], fns["calculate_unweighted_accuracy"]

    def cat(name):
        a, n = CATEGORIES[name]
        return {"accuracy": a, "total_count": n, "display_accuracy": a}

    mine = group_scores(CATEGORIES)
    # simple_python alone stands for BFCL's "simple" (Java and JavaScript not run)
    non_live = unweighted([cat(c) for c in ("simple_python", "multiple", "parallel", "parallel_multiple")])
    live = weighted(
        [cat(c) for c in ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")]
    )
    irrelevance = unweighted([cat("irrelevance"), cat("live_irrelevance")])
    multi_turn = unweighted([cat(c) for c in CATEGORIES if c.startswith("multi_turn")])
    assert mine["non_live_ast"]["accuracy"] == pytest.approx(non_live["accuracy"])
    assert mine["live_ast"]["accuracy"] == pytest.approx(live["accuracy"])
    assert mine["irrelevance"]["accuracy"] == pytest.approx(irrelevance["accuracy"])
    assert mine["relevance"]["accuracy"] == pytest.approx(0.75)
    assert mine["multi_turn"]["accuracy"] == pytest.approx(multi_turn["accuracy"])
    # the same numbers by hand from the formulas
    assert mine["non_live_ast"]["accuracy"] == pytest.approx((0.9 + 0.8 + 0.5 + 0.6) / 4)
    assert mine["live_ast"]["accuracy"] == pytest.approx(
        (0.7 * 258 + 0.4 * 1053 + 0.25 * 16 + 0.5 * 24) / (258 + 1053 + 16 + 24)
    )
    assert mine["irrelevance"]["accuracy"] == pytest.approx((0.95 + 0.3) / 2)
    assert mine["multi_turn"]["accuracy"] == pytest.approx((0.6 + 0.2 + 0.4 + 0.1) / 4)
    assert mine["non_live_ast"]["missing"] == ["simple_java", "simple_javascript"]
    assert mine["live_ast"]["missing"] == []
    assert "agentic" in mine["overall"] and "multi_turn" not in mine["overall"]


def test_groups_cover_only_the_categories_run():
    mine = group_scores({"irrelevance": (1.0, 240), "multi_turn_base": (0.5, 200)})
    assert set(mine) == {"irrelevance", "multi_turn", "overall"}
    assert mine["irrelevance"]["missing"] == ["live_irrelevance"]
    assert mine["multi_turn"]["categories"] == ["multi_turn_base"]
    assert mine["overall"].startswith("not computed")
    assert group_scores({}) == {}


class NeverCalls(ReferenceSolver):
    def complete(self, items, settings):
        reply = {"role": "assistant", "content": "I won't call anything."}
        return [Generated(dict(reply), finish_reason="stop") for _ in items]


def test_a_model_that_never_calls_a_function(tmp_path):
    bench = registry.get("bfcl")
    res = run(
        RunSettings("bfcl", backend="reference", model="nocall"),
        tmp_path,
        fresh=True,
        progress=False,
        solver=NeverCalls(bench),
    )
    groups = res["bfcl"]
    assert groups["non_live_ast"]["accuracy"] == 0.0
    assert groups["live_ast"]["accuracy"] == 0.0
    assert groups["irrelevance"]["accuracy"] == 1.0
    assert groups["relevance"]["accuracy"] == 0.0
    assert "multi_turn" not in groups
    # the headline is the mean over entries: the irrelevance entries' share of all entries
    irrelevant = sum(res["subsets"][c]["pass@1"]["problems"] for c in ("irrelevance", "live_irrelevance"))
    assert res["metrics"]["pass@1"]["value"] == pytest.approx(irrelevant / res["problems"])
    report = (tmp_path / "report.md").read_text()
    assert report == render(res)
    assert "| live_ast | 0.0 | weighted |" in report
    assert "| irrelevance | 100.0 | unweighted | irrelevance, live_irrelevance | - |" in report
    assert "simple_java, simple_javascript" in report
    assert "mean over all entries" in report


def test_a_run_of_one_category_has_its_group(tmp_path):
    res = run(
        RunSettings("bfcl", backend="reference", model="ref", subset=["live_parallel"]),
        tmp_path,
        fresh=True,
        progress=False,
    )
    assert res["subsets"] == {}
    assert res["bfcl"]["live_ast"]["accuracy"] == 1.0
    assert res["bfcl"]["live_ast"]["categories"] == ["live_parallel"]
    assert res["bfcl"]["live_ast"]["entries"] == res["problems"]
