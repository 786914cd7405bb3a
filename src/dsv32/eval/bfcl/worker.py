"""The BFCL API worker: runs inside :mod:`dsv32.envs.sandbox`, one process per episode.

It holds two worlds of BFCL's API class instances (``bfcl_eval/.../func_source_code``), ``model``
(what the model's calls change) and ``truth`` (what the ground truth's calls change), both loaded from
the entry's ``initial_config``, and answers one JSON request per stdin line with one JSON line:

- ``{"classes", "config", "long_context"}`` (first line): build both worlds → ``{"methods": [...]}``;
- ``{"op": "call", "world", "name", "args", "kwargs"}`` → ``{"result": text}``: the method's result as
  BFCL's checker writes it (a string as is, a dict as JSON, anything else ``str()``; an exception
  ``"Error during execution: ..."``);
- ``{"op": "compare"}`` → ``{"differences": {class: {attribute: {"model", "truth"}}}}``: the public
  attributes that differ between the worlds (BFCL's state check).

Standalone on purpose (standard library and bfcl-eval only): the sandbox starts it as a script.
Whatever the API classes print goes to stderr, so stdout carries only the protocol.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import json
import sys

PREFIX = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
MODULES = {
    "GorillaFileSystem": "gorilla_file_system",
    "MathAPI": "math_api",
    "MessageAPI": "message_api",
    "TwitterAPI": "posting_api",
    "TicketAPI": "ticket_api",
    "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking",
    "VehicleControlAPI": "vehicle_control",
}
STATELESS = ("MathAPI",)


def build(classes: list[str], config: dict, long_context: bool) -> dict[str, object]:
    world = {}
    for name in classes:
        instance = getattr(importlib.import_module(f"{PREFIX}.{MODULES[name]}"), name)()
        if name not in STATELESS:
            instance._load_scenario(copy.deepcopy(config.get(name, {})), long_context=long_context)
        world[name] = instance
    return world


def methods(world: dict[str, object]) -> dict[str, object]:
    """``{method name: bound method}``; a later class wins a name clash, as in BFCL."""
    out = {}
    for instance in world.values():
        for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_"):
                out[name] = method
    return out


def as_text(result: object) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json.dumps(result)
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def call(table: dict[str, object], name: str, args: list, kwargs: dict) -> str:
    if name not in table:
        return f"Error during execution: no function named {name!r}"
    try:
        with contextlib.redirect_stdout(sys.stderr):
            return as_text(table[name](*args, **kwargs))
    except Exception as err:  # the API's own error, as BFCL reports it to the model
        return f"Error during execution: {err}"


def differences(worlds: dict[str, dict[str, object]]) -> dict:
    out = {}
    for name, truth in worlds["truth"].items():
        model = worlds["model"][name]
        diff = {
            attr: {"model": repr(getattr(model, attr, None))[:500], "truth": repr(value)[:500]}
            for attr, value in vars(truth).items()
            if not attr.startswith("_") and getattr(model, attr, None) != value
        }
        if diff:
            out[name] = diff
    return out


def main() -> None:
    out = sys.stdout
    setup = json.loads(sys.stdin.readline())
    with contextlib.redirect_stdout(sys.stderr):
        worlds = {
            w: build(setup["classes"], setup["config"], setup["long_context"]) for w in ("model", "truth")
        }
    tables = {w: methods(world) for w, world in worlds.items()}
    out.write(json.dumps({"methods": sorted(tables["model"])}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "call":
            reply = {
                "result": call(tables[request["world"]], request["name"], request["args"], request["kwargs"])
            }
        else:
            reply = {"differences": differences(worlds)}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
