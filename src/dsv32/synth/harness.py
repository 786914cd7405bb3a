"""Runs one step of checking a synthesized task version, inside the sandbox; prints one JSON line.

    python harness.py schema WORKSPACE                         # tool schemas from tools.py
    python harness.py solve WORKSPACE DB                       # solution.solve(tools) on DB

``schema``: every public function defined in ``tools.py`` is a tool ``NAME(db, **arguments)``; its
description is the docstring, each parameter after ``db`` needs a type annotation (``str``, ``int``,
``float``, ``bool``, ``list``, ``dict``) and is required unless it has a default. Prints
``{"ok": true, "tools": [OpenAI function schemas]}``.

``solve``: ``solution.solve(tools)`` where ``tools.NAME(...)`` calls the tool the way the
``general-tools`` environment does (a fresh connection to ``DB``, ``sqlite3.Row`` rows, a commit
after the call, arguments and results passed through JSON). Every call is recorded as
``{"name", "arguments"}`` with the arguments bound to their parameter names — the task's reference
calls. Prints ``{"ok": true, "answer": str, "calls": [...]}``; a tool that raises fails the solution.

Verification is not here: a version is verified by the ``general-tools`` environment's own runner
(:mod:`dsv32.envs.general.runner`), so a synthesized bundle is judged exactly as it will be judged there.

Standard library only: it runs as ``python -I -S``.
"""

import importlib.util
import inspect
import json
import sqlite3
import sys
import traceback

TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}
TYPE_NAMES = {t.__name__: name for t, name in TYPES.items()}  # string annotations (``from __future__``)


class HarnessError(Exception):
    """A version that does not follow the contract (the message says what to fix)."""


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _functions(module):
    return {
        name: fn
        for name, fn in vars(module).items()
        if not name.startswith("_") and inspect.isfunction(fn) and fn.__module__ == module.__name__
    }


def _type_name(annotation):
    if annotation in TYPES:
        return TYPES[annotation]
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    base = text.split("[")[0].strip()
    if base in TYPE_NAMES:
        return TYPE_NAMES[base]
    raise HarnessError(f"annotation {text!r} is not one of str, int, float, bool, list, dict")


def schema(workspace):
    tools = _functions(_load(f"{workspace}/tools.py", "synth_tools"))
    if not tools:
        raise HarnessError("tools.py defines no public function; each tool is a function NAME(db, ...)")
    out = []
    for name, fn in sorted(tools.items()):
        params = list(inspect.signature(fn).parameters.values())
        if not params or params[0].name != "db":
            raise HarnessError(f"tool {name}: the first parameter must be db (the sqlite3 connection)")
        doc = inspect.getdoc(fn)
        if not doc:
            raise HarnessError(f"tool {name}: add a docstring (it is the description the model reads)")
        props, required = {}, []
        for p in params[1:]:
            if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                raise HarnessError(f"tool {name}: parameter {p.name} must be a plain named parameter")
            if p.annotation is p.empty:
                raise HarnessError(
                    f"tool {name}: annotate parameter {p.name} (str, int, float, bool, list, dict)"
                )
            try:
                props[p.name] = {"type": _type_name(p.annotation)}
            except HarnessError as err:
                raise HarnessError(f"tool {name}: parameter {p.name}: {err}") from None
            if p.default is p.empty:
                required.append(p.name)
        parameters = {"type": "object", "properties": props, "required": required}
        out.append(
            {"type": "function", "function": {"name": name, "description": doc, "parameters": parameters}}
        )
    return {"ok": True, "tools": out}


class _Tools:
    """The only handle a solution gets: one method per tool, recorded."""

    def __init__(self, functions, db_path):
        self._functions, self._db_path, self.calls = functions, db_path, []

    def __getattr__(self, name):
        if name.startswith("_") or name not in self._functions:
            raise AttributeError(f"there is no tool {name!r}; the tools are {sorted(self._functions)}")
        fn = self._functions[name]

        def call(*args, **kwargs):
            bound = inspect.signature(fn).bind(None, *args, **kwargs)
            arguments = {k: v for k, v in bound.arguments.items() if k != "db"}
            arguments = json.loads(json.dumps(arguments))
            self.calls.append({"name": name, "arguments": arguments})
            db = sqlite3.connect(self._db_path)
            db.row_factory = sqlite3.Row
            try:
                result = fn(db, **arguments)
                db.commit()
            finally:
                db.close()
            return json.loads(json.dumps(result, default=str))

        return call


def solve(workspace, db_path):
    functions = _functions(_load(f"{workspace}/tools.py", "synth_tools"))
    solution = _load(f"{workspace}/solution.py", "synth_solution")
    if not inspect.isfunction(getattr(solution, "solve", None)):
        raise HarnessError("solution.py must define solve(tools) returning the final answer text")
    tools = _Tools(functions, db_path)
    answer = solution.solve(tools)
    if not isinstance(answer, str):
        raise HarnessError(f"solve(tools) returned {type(answer).__name__}; return the final answer as a str")
    return {"ok": True, "answer": answer, "calls": tools.calls}


def main(argv):
    try:
        mode, args = argv[1], argv[2:]
        out = {"schema": schema, "solve": solve}[mode](*args)
    except HarnessError as err:
        out = {"ok": False, "error": str(err)}
    except Exception:
        out = {"ok": False, "error": traceback.format_exc(limit=4)}
    sys.stdout.write(json.dumps(out, default=str) + "\n")


if __name__ == "__main__":
    main(sys.argv)
