"""BFCL v4's data as the ``bfcl-eval`` package ships it, and its function docs as OpenAI tools.

- :func:`load_entries` / :func:`load_answers`: ``bfcl_eval/data/BFCL_v4_<category>.json`` and
  ``possible_answer/`` (JSON lines), read as files: the package's modules that need its heavy
  dependencies are never imported.
- :func:`openai_tool`: a BFCL function doc as an OpenAI tool. BFCL's types become JSON-schema types
  (``dict`` → ``object``, ``float`` → ``number``, ``tuple`` → ``array``, ``any`` → no constraint) and
  names get the characters the Chat Completions API allows (``math.factorial`` →
  ``math_factorial``, as BFCL names them for function-calling models; a call must use that name).
"""

from __future__ import annotations

import copy
import re
from functools import cache
from pathlib import Path

from dsv32.eval.errors import EvalError
from dsv32.jsonl import read_jsonl

TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}
_NAME = re.compile(r"[^A-Za-z0-9_-]")


@cache
def data_dir() -> Path:
    """``bfcl_eval/data`` of the installed package (found without importing its modules)."""
    from importlib.util import find_spec

    spec = find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise EvalError(
            "BFCL needs the bfcl-eval package: pip install --no-deps bfcl-eval (its data and API classes "
            "are used; its pinned dependencies are not needed)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


@cache
def load_file(name: str) -> tuple[dict, ...]:
    """The rows of ``data_dir() / name``, read once (shared: callers copy what they change)."""
    return tuple(row for _, row in read_jsonl(data_dir() / name, EvalError))


def load_entries(category: str) -> list[dict]:
    """The test entries of one category (deep copies: callers may change them)."""
    return copy.deepcopy(list(load_file(f"BFCL_v4_{category}.json")))


def load_answers(category: str) -> dict[str, list]:
    """``{entry id: ground_truth}`` of one category."""
    return {row["id"]: row["ground_truth"] for row in load_file(f"possible_answer/BFCL_v4_{category}.json")}


def chosen_categories(benchmark: str, subset: list[str] | None, categories: tuple[str, ...]) -> list[str]:
    """The categories a run covers: ``subset`` (checked against ``categories``) or all of them."""
    unknown = sorted(set(subset or ()) - set(categories))
    if unknown:
        raise EvalError(f"{benchmark} has no category {unknown}; choose from {', '.join(categories)}")
    return list(subset or categories)


def tool_name(name: str) -> str:
    """A BFCL function name as an API-legal tool name."""
    return _NAME.sub("_", name)[:64]


def json_schema(node: object) -> object:
    """BFCL's parameter schema with JSON-schema types (recursively)."""
    if isinstance(node, list):
        return [json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "type" and isinstance(value, str):
            mapped = TYPES.get(value, value)
            if mapped is not None:
                out[key] = mapped
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: json_schema(v) for name, v in value.items()}
        else:
            out[key] = json_schema(value)
    return out


def openai_tool(function: dict) -> dict:
    """A BFCL function doc as an OpenAI function tool."""
    parameters = json_schema(function.get("parameters") or {"type": "dict", "properties": {}})
    parameters.setdefault("type", "object")
    return {
        "type": "function",
        "function": {
            "name": tool_name(function["name"]),
            "description": function.get("description", ""),
            "parameters": parameters,
        },
    }
