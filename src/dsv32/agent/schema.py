"""Tool schemas: from a Python signature (pydantic) and checks of arguments against a JSON schema.

- :func:`function_schema` turns ``def f(x: int, unit: str = "m") -> ...`` and its docstring into the
  ``parameters`` JSON schema OpenAI tools carry, plus a pydantic model that validates calls. The
  description is the docstring's text before its first section; parameter descriptions come from a
  Google-style ``Args:`` section or ``:param name:`` lines.
- :func:`check_arguments` validates arguments against a hand-written JSON schema (an environment's
  tools): ``type`` (one or a list), ``enum``, ``const``, ``properties``, ``required``,
  ``additionalProperties``, ``items``, ``minItems``/``maxItems``, ``minLength``/``maxLength``,
  ``minimum``/``maximum`` (and the exclusive forms), ``anyOf``/``oneOf``/``allOf`` and local
  ``$ref`` (``#/$defs/...``). Other keywords are not checked. It returns every problem, each as
  ``path: what is wrong``, so the model sees all of them at once.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from dsv32.agent.errors import AgentError

_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Params|Returns?|Raises|Yields|Examples?|Notes?):\s*$")
_GOOGLE_PARAM = re.compile(r"^(\s*)(\*{0,2}\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")
_SPHINX_PARAM = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """``(description, {parameter: description})`` of a Google- or Sphinx-style docstring."""
    lines = inspect.cleandoc(doc or "").splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    section, current, indent = None, None, 0
    for line in lines:
        header = _SECTION.match(line)
        sphinx = _SPHINX_PARAM.match(line)
        if header:
            section, current = header.group(1).lower(), None
            continue
        if sphinx:
            section, current = "sphinx", sphinx.group(1)
            params[current] = sphinx.group(2).strip()
            continue
        if line.lstrip().startswith(":"):  # :returns:, :raises: ... end the description or a :param:
            section, current = "sphinx", None
            continue
        if section is None:
            description.append(line)
            continue
        if section in ("args", "arguments", "parameters", "params"):
            match = _GOOGLE_PARAM.match(line)
            if match and (current is None or len(match.group(1)) <= indent):
                indent, current = len(match.group(1)), match.group(2).lstrip("*")
                params[current] = match.group(4).strip()
                continue
        if (
            current is not None
            and line.strip()
            and section in ("args", "arguments", "parameters", "params", "sphinx")
        ):
            params[current] = (params[current] + " " + line.strip()).strip()
    return "\n".join(description).strip(), params


def _strip_titles(schema: Any) -> Any:
    """pydantic's schema without its ``title`` keywords (property names called "title" stay)."""
    if isinstance(schema, list):
        return [_strip_titles(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs") and isinstance(value, dict):
            out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
        else:
            out[key] = _strip_titles(value)
    return out


def function_schema(fn: Callable[..., Any], name: str) -> tuple[str, dict, type[BaseModel]]:
    """``(description, parameters JSON schema, pydantic arguments model)`` of ``fn``.

    Every parameter must be passable by keyword (no ``*args`` / ``**kwargs``); one without a type
    hint accepts any JSON value. Unknown arguments are rejected (``additionalProperties: false``).
    """
    try:
        signature = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
    except (TypeError, ValueError, NameError) as err:
        raise AgentError(f"tool {name!r}: cannot read the signature of {fn!r} ({err})") from err
    description, docs = parse_docstring(inspect.getdoc(fn))
    fields: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise AgentError(
                f"tool {name!r}: parameter {param.name!r} is {param.kind.description}; a tool takes named "
                "arguments only (pass an explicit schema= for anything else)"
            )
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, Field(default, description=docs.get(param.name)))
    config = ConfigDict(extra="forbid", arbitrary_types_allowed=False)
    try:
        model = create_model(f"{name}_arguments", __config__=config, **fields)
        schema = _strip_titles(model.model_json_schema())
    except (TypeError, ValueError) as err:  # pydantic's schema errors are TypeErrors/ValueErrors
        raise AgentError(
            f"tool {name!r}: its parameters cannot be described as JSON ({err}); use JSON-friendly type "
            "hints or pass an explicit schema="
        ) from err
    schema.setdefault("properties", {})
    schema.setdefault("required", [])
    return description, schema, model


def pydantic_problems(err: ValidationError) -> list[str]:
    """One ``path: message (got value)`` line per pydantic error."""
    out = []
    for e in err.errors(include_url=False):
        where = ".".join(str(p) for p in e["loc"]) or "arguments"
        got = "" if e["type"] == "missing" else f" (got {e.get('input')!r})"
        out.append(f"{where}: {e['msg']}{got}")
    return out


# ---------------------------------------------------------------------------- JSON-schema checks
_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
    ),
}


def _resolve(schema: dict, root: dict) -> dict:
    ref = schema.get("$ref")
    if not isinstance(ref, str):
        return schema
    if not ref.startswith("#/"):
        raise AgentError(f"schema $ref {ref!r}: only local references (#/$defs/...) are supported")
    target: Any = root
    for part in ref[2:].split("/"):
        if not isinstance(target, dict) or part not in target:
            raise AgentError(f"schema $ref {ref!r} points to nothing")
        target = target[part]
    return target


def check_arguments(value: Any, schema: dict, root: dict | None = None, path: str = "") -> list[str]:
    """Every way ``value`` violates ``schema`` (empty when it conforms)."""
    root = schema if root is None else root
    schema = _resolve(schema, root)
    where = path or "arguments"
    problems: list[str] = []
    expected = schema.get("type")
    if expected is not None:
        names = expected if isinstance(expected, list) else [expected]
        if not any(_TYPES.get(n, lambda v: True)(value) for n in names):
            return [f"{where}: expected {' or '.join(names)}, got {_json_type(value)} {_short(value)}"]
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where}: must be one of {schema['enum']}, got {_short(value)}")
    if "const" in schema and value != schema["const"]:
        problems.append(f"{where}: must be {schema['const']!r}, got {_short(value)}")
    for key in ("anyOf", "oneOf"):
        if key in schema and all(check_arguments(value, s, root, path) for s in schema[key]):
            problems.append(f"{where}: matches none of the allowed forms ({key})")
    for sub in schema.get("allOf", []):
        problems += check_arguments(value, sub, root, path)
    if isinstance(value, dict):
        problems += _check_object(value, schema, root, path)
    elif isinstance(value, list):
        problems += _check_array(value, schema, root, path)
    elif isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            problems.append(f"{where}: shorter than {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            problems.append(f"{where}: longer than {schema['maxLength']} characters")
    elif _TYPES["number"](value):
        problems += _check_number(value, schema, where)
    return problems


def _check_object(value: dict, schema: dict, root: dict, path: str) -> list[str]:
    problems = []
    properties = schema.get("properties", {})
    for key in schema.get("required", []):
        if key not in value:
            problems.append(f"{_join(path, key)}: required field missing")
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in properties:
            problems += check_arguments(item, properties[key], root, _join(path, key))
        elif extra is False:
            allowed = ", ".join(properties) or "none"
            problems.append(f"{_join(path, key)}: unknown field (allowed: {allowed})")
        elif isinstance(extra, dict):
            problems += check_arguments(item, extra, root, _join(path, key))
    return problems


def _check_array(value: list, schema: dict, root: dict, path: str) -> list[str]:
    where = path or "arguments"
    problems = []
    if len(value) < schema.get("minItems", 0):
        problems.append(f"{where}: fewer than {schema['minItems']} items")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        problems.append(f"{where}: more than {schema['maxItems']} items")
    items = schema.get("items")
    if isinstance(items, dict):
        for i, item in enumerate(value):
            problems += check_arguments(item, items, root, f"{where}[{i}]")
    return problems


def _check_number(value: float, schema: dict, where: str) -> list[str]:
    checks = (
        ("minimum", lambda b: value >= b, ">="),
        ("maximum", lambda b: value <= b, "<="),
        ("exclusiveMinimum", lambda b: value > b, ">"),
        ("exclusiveMaximum", lambda b: value < b, "<"),
    )
    return [
        f"{where}: must be {op} {schema[key]}, got {value}"
        for key, ok, op in checks
        if isinstance(schema.get(key), int | float) and not ok(schema[key])
    ]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _json_type(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _TYPES[name](value):
            return name
    return type(value).__name__


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
