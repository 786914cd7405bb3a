"""Recipes: TOML files read into plain config dataclasses, every field checked when it is read.

A recipe is a TOML table of sections (``[grpo]``, ``[warmup]``, ...) whose keys are the fields of a
dataclass. :func:`read_recipe` reads the file and applies ``section.field=value`` overrides (the
CLI's ``--set``); :func:`build_section` turns one section into its dataclass and checks

- that every key is a field (unknown keys name the known ones),
- each value's type against the field's annotation (``int``, ``float`` — an integer is accepted —,
  ``bool``, ``str``, ``list[...]``, ``dict[str, ...]``, ``X | None``),
- each value's range against the dataclass's ``RANGES`` (``{"lr": POSITIVE, "top_p": UNIT, ...}``),

and raises :class:`RecipeError` naming the section, the key, the value and what is allowed. Overrides
go through the same checks, because they are applied to the data before it is built. A config
dataclass that derives from :class:`Checked` applies its ``RANGES`` when it is built in Python too,
so ``StageConfig(lr=-1.0)`` is refused as ``lr = -1`` in a recipe is. This module
imports nothing of ours but :mod:`dsv32.errors`, so every package with a recipe can use it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
import tomllib
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from dsv32.errors import DSV32Error


class RecipeError(DSV32Error, ValueError):
    """A recipe, a section or an override that does not fit the config schema."""


@dataclass(frozen=True)
class Rule:
    """A range check: ``ok(value)`` is True for allowed values; ``allowed`` says which in words.
    ``on_disk`` rules look at the filesystem (a path must exist): they run when a recipe is read,
    not when a config is built in Python (a default may name a file made later)."""

    ok: Callable[[Any], bool]
    allowed: str
    on_disk: bool = False
    why: Callable[[Any], str] | None = None  # why a refused value is refused (appended to the message)


def at_least(lo: float) -> Rule:
    return Rule(lambda v: v >= lo, f">= {lo}")


def in_range(lo: float, hi: float) -> Rule:
    return Rule(lambda v: lo <= v <= hi, f"in [{lo}, {hi}]")


def one_of(*choices: Any) -> Rule:
    return Rule(lambda v: v in choices, "one of " + ", ".join(repr(c) for c in choices))


POSITIVE = Rule(lambda v: v > 0, "> 0")
NON_NEGATIVE = Rule(lambda v: v >= 0, ">= 0")
UNIT = in_range(0.0, 1.0)  # probabilities and fractions
OPEN_UNIT = Rule(lambda v: 0 < v <= 1, "in (0, 1]")
EXISTING_PATH = Rule(lambda v: Path(v).exists(), "an existing file or directory", on_disk=True)
# AdamW's (beta1, beta2): exactly two, each in [0, 1)
BETAS = Rule(
    lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "two numbers [beta1, beta2], each in [0, 1)"
)


def out_dir_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be (or become) an output directory, or None when it can: an existing path
    must be a writable directory; otherwise its nearest existing ancestor must be a directory in which
    a directory can be made (tried with an empty directory that is removed at once, so places that
    refuse new entries — ``/proc``, read-only mounts, another user's folder — are found before a run
    starts)."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            return f"{path} exists and is not a directory"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"{path} is not writable"
        return None
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".dsv32-probe-", dir=parent))
    except OSError as err:
        return f"no directory can be made in {parent} ({err.strerror or err})"
    return None


OUT_DIR = Rule(
    lambda v: bool(v) and out_dir_problem(v) is None,
    "a directory that exists or can be created",
    on_disk=True,
    why=lambda v: "it is empty" if not v else out_dir_problem(v) or "",
)


def each(rule: Rule) -> Rule:
    """Apply ``rule`` to every item of a list (or every value of a table)."""
    return Rule(
        lambda v: all(rule.ok(x) for x in (v.values() if isinstance(v, dict) else v)),
        f"every item {rule.allowed}",
    )


class Checked:
    """Base of the config dataclasses: ``__post_init__`` applies the class's ``RANGES`` to the values
    it was built with (:func:`check_ranges`), raising the error class named in the class statement
    (``class StageConfig(Checked, error=TrainConfigError)``). A subclass with its own
    ``__post_init__`` calls ``super().__post_init__()`` after filling in defaults."""

    RANGES: ClassVar[dict[str, Rule]] = {}
    _error: ClassVar[type[Exception]] = RecipeError

    def __init_subclass__(cls, error: type[Exception] | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if error is not None:
            cls._error = error

    def __post_init__(self) -> None:
        check_ranges(self, type(self)._error)


def check_ranges(obj: Any, error: type[Exception] = RecipeError) -> None:
    """Apply ``type(obj).RANGES`` to ``obj``'s values; the first one out of range raises ``error``
    naming the class, the field, the value and what is allowed. None is left to the field's meaning,
    and ``on_disk`` rules to the recipe reader."""
    for key, rule in getattr(type(obj), "RANGES", {}).items():
        value = getattr(obj, key)
        if value is None or rule.on_disk:
            continue
        try:
            ok, allowed = rule.ok(value), rule.allowed
        except TypeError:  # a value of another type (a string where a number belongs)
            ok, allowed = False, f"{_type_name(typing.get_type_hints(type(obj))[key])}, {rule.allowed}"
        if not ok:
            raise error(f"{type(obj).__name__}.{key} = {_show(value)}: must be {allowed}")


# ---------------------------------------------------------------------------------------------- types
def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        name = " or ".join(_type_name(a) for a in args)
        return f"{name} (or leave it out)" if type(None) in typing.get_args(tp) else name
    if origin is list:
        return f"an array of {_type_name(typing.get_args(tp)[0])}s" if typing.get_args(tp) else "an array"
    if origin is dict:
        return "a table"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _check_type(value: Any, tp: Any) -> tuple[bool, Any]:
    """``(ok, value)`` — ints become floats where a float is wanted."""
    if tp is Any:
        return True, value
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        for arg in typing.get_args(tp):
            if arg is type(None):
                if value is None:
                    return True, None
                continue
            ok, converted = _check_type(value, arg)
            if ok:
                return True, converted
        return False, value
    if origin is list:
        if not isinstance(value, list):
            return False, value
        (item,) = typing.get_args(tp) or (Any,)
        out = []
        for x in value:
            ok, x = _check_type(x, item)
            if not ok:
                return False, value
            out.append(x)
        return True, out
    if origin is dict:
        if not isinstance(value, dict):
            return False, value
        _, item = typing.get_args(tp) or (str, Any)
        out = {}
        for k, x in value.items():
            ok, x = _check_type(x, item)
            if not ok:
                return False, value
            out[k] = x
        return True, out
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False, value
        return math.isfinite(value), float(value)
    if tp is str:
        return isinstance(value, str), value
    if dataclasses.is_dataclass(tp):
        return isinstance(value, (tp, dict)), value
    return isinstance(value, tp) if isinstance(tp, type) else True, value


def _show(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (str, list, dict, bool)) or value is None else repr(value)


def check_fields(
    cls: type, data: dict[str, Any], where: str, error: type[RecipeError] = RecipeError
) -> dict[str, Any]:
    """Check ``data`` against dataclass ``cls`` (keys, types, ``cls.RANGES``) → the converted values;
    a problem raises ``error`` (a :class:`RecipeError` subclass: each package names its own)."""
    if not isinstance(data, dict):
        raise error(f"[{where}] must be a table, got {_show(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise error(f"unknown keys in [{where}]: {unknown}; known: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    ranges: dict[str, Rule] = getattr(cls, "RANGES", {})
    out = {}
    for key, value in data.items():
        ok, value = _check_type(value, hints[key])
        if not ok:
            raise error(f"[{where}] {key} = {_show(data[key])}: must be {_type_name(hints[key])}")
        rule = ranges.get(key)
        if rule is not None and value is not None and not rule.ok(value):
            why = f": {rule.why(value)}" if rule.why is not None else ""
            raise error(f"[{where}] {key} = {_show(data[key])}: must be {rule.allowed}{why}")
        out[key] = value
    return out


def check_sections(
    data: dict[str, Any], accepted: Iterable[str], error: type[RecipeError] = RecipeError, where: str = ""
) -> None:
    """Refuse the top-level keys of ``data`` (or of the table ``where``) that are not in ``accepted``,
    naming them and every key the reader accepts, so the message is the list a user needs."""
    accepted = sorted(set(accepted))
    unknown = sorted(set(data) - set(accepted))
    if unknown:
        place = f" in [{where}]" if where else ""
        raise error(f"unknown sections {unknown}{place}; accepted: {', '.join(accepted)}")


def build_section(cls: type, data: Any, where: str, error: type[RecipeError] = RecipeError):
    """``cls(**data)`` after :func:`check_fields`; a check the dataclass itself makes in
    ``__post_init__`` is reported as ``error`` under the section's name."""
    values = check_fields(cls, data, where, error)
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        message = str(err)
        raise error(message if message.startswith("[") else f"[{where}] {message}") from err


# ---------------------------------------------------------------------------------------------- reading
def read_recipe(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    error: type[RecipeError] = RecipeError,
) -> dict[str, Any]:
    """A TOML recipe as a dict (empty when ``path`` is None) with ``section.field=value`` overrides
    applied (values parsed as JSON or TOML literals, else taken as strings)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as err:
            raise error(f"cannot read recipe {path}: {err.strerror or err}") from err
        except UnicodeDecodeError as err:
            raise error(f"{path}: {not_utf8(err)}") from err
        except tomllib.TOMLDecodeError as err:
            raise error(f"{path} is not valid TOML: {err}") from err
    for item in overrides or []:
        apply_override(data, item, error)
    return data


def not_utf8(err: UnicodeDecodeError) -> str:
    """``line L: not UTF-8 text (byte 0xff at column C)`` for an error decoding a whole text."""
    data = bytes(err.object)
    line = data.count(b"\n", 0, err.start) + 1
    column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
    return f"line {line}: not UTF-8 text (byte 0x{data[err.start]:02x} at column {column}); save it as UTF-8"


def apply_override(data: dict[str, Any], item: str, error: type[RecipeError] = RecipeError) -> None:
    """``"warmup.steps=50"`` → ``data["warmup"]["steps"] = 50`` (in place)."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise error(f"override {item!r} must look like section.field=value")
    value: Any
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise error(f"override {item!r}: {part} is not a section")
    node[parts[-1]] = value
