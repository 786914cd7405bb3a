"""BFCL's AST check of single-turn function calls, written after the rules of
``bfcl_eval/eval_checker/ast_eval/ast_checker.py`` (Python categories; that module itself needs the
package's heavy dependencies).

A model's answer is a list of calls ``{function name: {argument: value}}``; the ground truth lists,
per expected call, ``{function name: {parameter: [allowed values]}}`` where ``""`` among the allowed
values marks an optional parameter. One call matches one expected call when:

1. the names are equal; every ``required`` parameter is given; every given argument is a parameter
   of the function and of the expected call;
2. each value has the parameter's type (an ``int`` is accepted for ``float``; ``array``/``tuple``
   items are checked one level deep; a value of the ground truth's own type where that differs from
   the declared type is taken as a variable name and compared as is);
3. each value is allowed: strings compared after :func:`standardize` (case, spaces and ``,./-_*^``
   ignored), lists element-wise the same way, dicts key by key, lists of dicts dict by dict, other
   values by equality;
4. every expected parameter without ``""`` among its values is given.

Categories: ``simple`` (exactly one call), ``multiple`` (one call, the right function among several),
``parallel`` / ``parallel_multiple`` (the same number of calls, matched in any order).
"""

from __future__ import annotations

import re
from typing import Any

PY_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}
_STRIP = re.compile(r"[ ,./\-_*^]")


def standardize(text: str) -> str:
    return _STRIP.sub("", text).lower().replace("'", '"')


def _std(value: Any) -> Any:
    return standardize(value) if isinstance(value, str) else value


def _answer_type(allowed: list) -> type | None:
    return next((type(v) for v in allowed if v != ""), None)


def _type_ok(value: Any, allowed: list, expected: type, nested: type | None) -> tuple[bool, bool, str]:
    """``(ok, is_variable, error)`` of BFCL's type check."""
    answer_type = _answer_type(allowed)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if nested is None:
            return True, is_variable, ""
        for option in allowed:
            if isinstance(option, list) and all(_type_ok(v, option, nested, None)[0] for v in value):
                return True, is_variable, ""
        return False, False, f"items of {value!r} are not all {nested.__name__}"
    if answer_type is not None and type(value) is answer_type:
        return True, True, ""
    return False, False, f"expected {expected.__name__}, got {type(value).__name__} ({value!r})"


def _dict_ok(value: dict, allowed: list) -> bool:
    for option in allowed:
        if option == "" or not isinstance(option, dict):
            continue
        if any(k not in option or _std(v) not in [_std(a) for a in option[k]] for k, v in value.items()):
            continue
        if any(k not in value and "" not in vals for k, vals in option.items()):
            continue
        return True
    return False


def _list_dict_ok(value: list, allowed: list) -> bool:
    return any(
        isinstance(option, list)
        and len(option) == len(value)
        and all(isinstance(v, dict) and _dict_ok(v, [o]) for v, o in zip(value, option))
        for option in allowed
    )


def _value_ok(value: Any, allowed: list, expected: type, nested: type | None) -> bool:
    if expected is dict:
        return isinstance(value, dict) and _dict_ok(value, allowed)
    if expected is list and nested is dict:
        return _list_dict_ok(value, allowed)
    if expected is str:
        return standardize(value) in [standardize(a) for a in allowed if isinstance(a, str)]
    if expected is list:
        return [_std(v) for v in value] in [
            [_std(a) for a in opt] for opt in allowed if isinstance(opt, list)
        ]
    return value in allowed


def check_call(function: dict, call: dict, expected: dict) -> str | None:
    """None when ``call`` (``{name: args}``) matches ``expected`` for ``function``, else the error."""
    (name, allowed_args), (called, args) = next(iter(expected.items())), next(iter(call.items()))
    if called != name:
        return f"called {called!r}, expected {name!r}"
    if not isinstance(args, dict):
        return f"arguments of {name!r} are not an object"
    params = function.get("parameters", {}).get("properties", {})
    missing = [p for p in function.get("parameters", {}).get("required", []) if p not in args]
    if missing:
        return f"{name}: missing required parameter(s) {missing}"
    for param, value in args.items():
        if param not in params or param not in allowed_args:
            return f"{name}: unexpected parameter {param!r}"
        declared = params[param].get("type", "any")
        expected_type = PY_TYPES.get(declared, str)
        nested = None
        if declared in ("array", "tuple"):
            nested = PY_TYPES.get(params[param].get("items", {}).get("type", "any"), str)
        if declared == "tuple" and isinstance(value, tuple):
            value = list(value)
        if declared == "float" and type(value) is int:
            value = float(value)
        ok, is_variable, error = _type_ok(value, allowed_args[param], expected_type, nested)
        if not ok:
            return f"{name}.{param}: {error}"
        good = (
            value in allowed_args[param]
            if is_variable
            else _value_ok(value, allowed_args[param], expected_type, nested)
        )
        if not good:
            return f"{name}.{param}: {value!r} is not one of {allowed_args[param]!r}"
    absent = [p for p, vals in allowed_args.items() if p not in args and "" not in vals]
    if absent:
        return f"{name}: expected parameter(s) {absent} not given"
    return None


def _find(functions: list[dict], name: str) -> dict:
    return next((f for f in functions if f["name"] == name), {"name": name, "parameters": {}})


def check(category: str, functions: list[dict], calls: list[dict], truth: list[dict]) -> str | None:
    """None when the calls answer the entry, else why not (see the module docstring)."""
    if len(calls) != len(truth):
        return f"made {len(calls)} call(s), expected {len(truth)}"
    if "parallel" not in category:
        expected = truth[0]
        return check_call(_find(functions, next(iter(expected))), calls[0], expected)
    left = list(range(len(calls)))
    for expected in truth:
        function = _find(functions, next(iter(expected)))
        errors = [(i, check_call(function, calls[i], expected)) for i in left]
        match = next((i for i, err in errors if err is None), None)
        if match is None:
            return f"no call matches {next(iter(expected))!r}: " + "; ".join(str(e) for _, e in errors[:2])
        left.remove(match)
    return None
