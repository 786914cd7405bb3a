"""BFCL's own group scores (its leaderboard columns) from per-category accuracies.

BFCL does not average over all entries: it scores each category, then combines categories in
groups, either weighted by entry count (the mean over the group's entries) or unweighted (the
mean of the category accuracies). The groups and how each is combined:

- ``non_live_ast``: unweighted over ``simple``, ``multiple``, ``parallel``, ``parallel_multiple``,
  where ``simple`` is itself the unweighted mean of the Python, Java and JavaScript simple
  categories (a run that lacks some of them uses those it has, and names the others in ``missing``).
- ``live_ast``: weighted over the four ``live_*`` AST categories.
- ``irrelevance``: unweighted over ``irrelevance`` and ``live_irrelevance``.
- ``relevance``: ``live_relevance``.
- ``multi_turn``: unweighted over the four ``multi_turn_*`` categories.

A group is computed from the categories of it that the run has; ``missing`` names the
categories BFCL counts in it that the run lacks. BFCL's overall score weighs non-live AST,
live AST, irrelevance, multi-turn and its agentic (web search, memory) categories 10:10:10:30:40;
we do not run the agentic ones, so the overall is not computed and ``overall`` says which parts
are missing.
"""

from __future__ import annotations

SIMPLE = ("simple_python", "simple_java", "simple_javascript")
GROUPS: dict[str, tuple[str, tuple]] = {
    "non_live_ast": ("unweighted", (SIMPLE, "multiple", "parallel", "parallel_multiple")),
    "live_ast": ("weighted", ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")),
    "irrelevance": ("unweighted", ("irrelevance", "live_irrelevance")),
    "relevance": ("unweighted", ("live_relevance",)),
    "multi_turn": (
        "unweighted",
        ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"),
    ),
}
OVERALL_PARTS = ("non_live_ast", "live_ast", "irrelevance", "multi_turn", "agentic")


def _combine(how: str, parts: list[tuple[float, int]]) -> tuple[float, int]:
    total = sum(n for _, n in parts)
    if how == "weighted":
        return sum(a * n for a, n in parts) / total, total
    return sum(a for a, _ in parts) / len(parts), total


def group_scores(categories: dict[str, tuple[float, int]]) -> dict:
    """BFCL's groups from ``categories``: each category's ``(accuracy, entries)``. Returns each
    group the run has any category of: ``accuracy``, ``entries``, ``method``, ``categories`` (those
    used) and ``missing`` (those BFCL counts that the run lacks)."""
    out: dict = {}
    for group, (how, members) in GROUPS.items():
        parts, used, missing = [], [], []
        for member in members:
            names = member if isinstance(member, tuple) else (member,)
            have = [c for c in names if c in categories]
            missing += [c for c in names if c not in categories]
            if have:
                used += have
                parts.append(_combine("unweighted", [categories[c] for c in have]))
        if parts:
            accuracy, entries = _combine(how, parts)
            out[group] = {
                "accuracy": accuracy,
                "entries": entries,
                "method": how,
                "categories": used,
                "missing": missing,
            }
    if out:
        lacking = [p for p in OVERALL_PARTS if p not in out]
        out["overall"] = f"not computed: BFCL's overall needs {', '.join(lacking)}, not in this run"
    return out


def from_subsets(subsets: dict) -> dict:
    """:func:`group_scores` of a run's ``subsets`` (results.json), by their pass@1."""
    return group_scores({k: (v["pass@1"]["value"], v["pass@1"]["problems"]) for k, v in subsets.items()})
