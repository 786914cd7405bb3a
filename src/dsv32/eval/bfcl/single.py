"""BFCL v4 single-turn categories, graded by BFCL's own AST checker (:mod:`dsv32.eval.bfcl.official`).

A problem is the entry's first turn (its messages, live entries' system prompts included) with its
functions as OpenAI tools, named as BFCL names them for a function-calling model (``math.factorial``
offered as ``math_factorial``). The model answers with one assistant message; its ``tool_calls`` are
decoded as BFCL decodes an OpenAI function-calling reply (``[{name as called: arguments parsed from
JSON}]``; arguments that are not a JSON object fail) and given to BFCL's ``ast_checker``, so a call
must use the name it was offered. ``irrelevance`` and ``live_irrelevance`` pass when the reply makes no
call (or none that decodes); ``live_relevance`` passes when it makes at least one that decodes (BFCL
grades only that, so it ships no ground truth).

Entries no answer can pass under BFCL's rules (a required parameter the ground truth allows no value
for, an expected parameter the function does not define, a Java list of strings expected to hold a
number: 7 of the 2,501 graded entries of bfcl-eval 2026.3.23) are left out and listed in
``results.json`` under ``excluded``; BFCL's own score counts them as failed for every model.

The reference answer is the ground truth's first allowed value of every parameter (optional ones,
whose first allowed value is ``""``, left out), as tool calls (in Java and JavaScript written as
literals, :func:`_literal_args`); for the irrelevance categories a reply
without calls; for ``live_relevance`` a call of the first function with placeholder values of the
declared types for its required parameters.
"""

from __future__ import annotations

import json
from itertools import islice, product

from dsv32.eval.bfcl import groups
from dsv32.eval.bfcl.data import chosen_categories, load_answers, load_entries, openai_tool, tool_name
from dsv32.eval.bfcl.langs import (
    STRING_ITEM_LISTS,
    STRING_ITEMS,
    category_language,
    language_docs,
    literal_candidates,
)
from dsv32.eval.bfcl.official import ast_checker
from dsv32.eval.types import Benchmark, Problem, Score

GRADED = (
    "simple_python",
    "simple_java",
    "simple_javascript",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
)
NO_CALL = ("irrelevance", "live_irrelevance")
SOME_CALL = ("live_relevance",)
CATEGORIES = GRADED + NO_CALL + SOME_CALL
PLACEHOLDER = {
    "string": "x",
    "integer": 1,
    "float": 1.0,
    "boolean": True,
    "array": [],
    "tuple": [],
    "dict": {},
}


def decode_calls(message: dict) -> tuple[list[dict] | None, str]:
    """``([{name as called: arguments}], "")``, or ``(None, why)`` when a call's arguments are not a
    JSON object."""
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        raw = function.get("arguments")
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError as err:
            return None, f"arguments of {function.get('name')!r} are not JSON ({err.msg})"
        except (ValueError, RecursionError) as err:  # a 5,000-digit number, arrays nested too deep
            return None, f"arguments of {function.get('name')!r} cannot be read ({type(err).__name__})"
        if not isinstance(args, dict):
            return None, f"arguments of {function.get('name')!r} are not a JSON object"
        calls.append({function.get("name"): args})
    return calls, ""


def _first_error(errors: object) -> str:
    """BFCL's first error message (a string, or for parallel calls a dict of sub-errors)."""
    first = errors[0] if isinstance(errors, list) and errors else errors
    return " ".join(str(first).split())


def _first(allowed: list) -> object:
    return next(v for v in allowed if v != "")


def pick(allowed: list) -> object:
    """The first allowed value (not ``""``); for dict values (and lists of dicts) that of every key."""
    value = _first(allowed)
    if isinstance(value, dict):
        return {k: _first(v) for k, v in value.items() if v and v[0] != ""}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [{k: _first(v) for k, v in d.items() if v and v[0] != ""} for d in value]
    return value


def reference_args(function: dict, allowed: dict) -> dict:
    """Arguments that play one expected call: every parameter of the function whose allowed values
    start with a real value, and every required one (BFCL's data marks a few required parameters
    optional; they take their first real value)."""
    params = function.get("parameters", {})
    required = set(params.get("required", []))
    known = params.get("properties", {})
    return {
        p: pick(vals)
        for p, vals in allowed.items()
        if p in known and any(v != "" for v in vals) and (vals[0] != "" or p in required)
    }


def unsatisfiable(functions: list[dict], truth: list[dict], category: str = "simple_python") -> str | None:
    """Why no answer can pass an entry, or None: a required parameter the ground truth allows no
    value for, an expected parameter the function does not define, or (Java, JavaScript) a list of
    string items whose every allowed value holds a non-string item (BFCL's converter reads every
    item of such a list as a string)."""
    lists = STRING_ITEM_LISTS.get(category_language(category), ())
    for expected in truth:
        ((name, allowed),) = expected.items()
        function = next((f for f in functions if f["name"] == name), None)
        if function is None:
            return f"the ground truth calls {name!r}, which the entry does not define"
        params = function.get("parameters", {})
        for p in params.get("required", []):
            if not [v for v in allowed.get(p, []) if v != ""]:
                return f"required parameter {name}.{p} has no allowed value in the ground truth"
        for p, vals in allowed.items():
            if p not in params.get("properties", {}) and "" not in vals:
                return f"the ground truth requires {name}.{p}, which the function does not define"
            prop = params.get("properties", {}).get(p, {})
            if (
                "" not in vals
                and prop.get("type") in lists
                and prop.get("items", {}).get("type") in STRING_ITEMS
                and all(isinstance(v, list) and any(not isinstance(x, str) for x in v) for v in vals)
            ):
                return (
                    f"the ground truth of {name}.{p} ({prop['type']} of {prop['items']['type']}) holds a "
                    "non-string item, and BFCL's converter reads every item of it as a string"
                )
    return None


def _literal_args(function: dict, expected: dict, category: str, limit: int = 512) -> dict:
    """Arguments of one expected Java / JavaScript call written as literals: the first combination of
    :func:`~dsv32.eval.bfcl.langs.literal_candidates` that BFCL's checker accepts (else the first)."""
    ((name, allowed),) = expected.items()
    args = reference_args(function, allowed)
    props = function.get("parameters", {}).get("properties", {})
    language = category_language(category)
    options = [
        literal_candidates(v, props.get(k, {}).get("items", {}).get("type", "any"), language)
        for k, v in args.items()
    ]
    combos = [dict(zip(args, combo)) for combo in islice(product(*options), limit)]
    accepted = (
        c for c in combos if ast_checker([function], [{tool_name(name): c}], [expected], category)["valid"]
    )
    return next(accepted, combos[0])


def reference_calls(functions: list[dict], truth: list[dict], category: str = "simple_python") -> list[dict]:
    """Tool calls that play the ground truth (Java and JavaScript arguments as literals)."""
    calls = []
    for i, expected in enumerate(truth):
        ((name, allowed),) = expected.items()
        function = next(f for f in functions if f["name"] == name)
        if category_language(category) == "python":
            args = reference_args(function, allowed)
        else:
            args = _literal_args(function, expected, category)
        call = {"name": tool_name(name), "arguments": json.dumps(args, ensure_ascii=False)}
        calls.append({"id": f"ref_{i}", "type": "function", "function": call})
    return calls


class BFCL(Benchmark):
    name = "bfcl"
    description = "BFCL v4 single-turn function calling (BFCL's AST checker; Python, Java, JavaScript, live)"
    source = "the bfcl-eval package's data/BFCL_v4_*.json and possible_answer/"
    packages = ("bfcl-eval",)
    metric = "accuracy"

    def subset_summaries(self, subsets: dict[str, dict]) -> dict:
        """BFCL's own group scores under ``bfcl`` (:mod:`dsv32.eval.bfcl.groups`)."""
        return {"bfcl": groups.from_subsets(subsets)} if subsets else {}

    def subsets(self) -> list[str]:
        return list(CATEGORIES)

    def problems(self, subset: list[str] | None = None, data: str | None = None) -> list[Problem]:
        out = []
        for category in chosen_categories("bfcl", subset, CATEGORIES):
            truths = load_answers(category) if category in GRADED else {}
            for entry in load_entries(category):
                functions = entry["function"]
                why = unsatisfiable(functions, truths[entry["id"]], category) if category in GRADED else None
                if why is not None:
                    self.excluded[entry["id"]] = why
                    continue
                data_ = {"category": category, "functions": functions, "truth": truths.get(entry["id"])}
                tools = [openai_tool(f) for f in language_docs(functions, category)]
                out.append(Problem(entry["id"], entry["question"][0], tools, category, data_))
        return out

    def score(self, problem: Problem, message: dict) -> Score:
        category, functions = problem.data["category"], problem.data["functions"]
        calls, error = decode_calls(message)
        if category in NO_CALL:
            return Score(1.0, "no call") if not calls else Score(0.0, f"made {len(calls)} call(s)")
        if calls is None:
            return Score(0.0, error)
        if category in SOME_CALL:
            return Score(1.0, "called") if calls else Score(0.0, "made no call")
        if not calls:
            return Score(0.0, "made no call")
        verdict = ast_checker(functions, calls, problem.data["truth"], category)
        if verdict["valid"]:
            return Score(1.0, "matches")
        return Score(
            0.0, f"{verdict.get('error_type', 'invalid')}: {_first_error(verdict.get('error'))}"[:300]
        )

    def reference(self, problem: Problem) -> dict:
        category = problem.data["category"]
        if category in NO_CALL:
            return {"role": "assistant", "content": "None of the functions fits this request."}
        if category in SOME_CALL:
            function = problem.data["functions"][0]
            params = function.get("parameters", {})
            args = {
                p: PLACEHOLDER.get(params["properties"][p].get("type"), "x")
                for p in params.get("required", [])
            }
            call = {
                "id": "ref_0",
                "type": "function",
                "function": {"name": tool_name(function["name"]), "arguments": json.dumps(args)},
            }
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        return {
            "role": "assistant",
            "content": "",
            "tool_calls": reference_calls(problem.data["functions"], problem.data["truth"], category),
        }
