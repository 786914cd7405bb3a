"""Tools: plain Python functions (or any callable with an explicit schema) the model may call.

A call goes through four checks before and after it runs, and each failure becomes the text of the
``tool`` message the model reads next — the loop itself never fails on a tool:

1. the tool exists (``unknown_tool``: the message lists the tools there are);
2. ``arguments`` is a JSON object (``bad_json``; an empty string counts as ``{}``);
3. the arguments fit the schema (``invalid_arguments``, every problem listed): strict pydantic
   validation for tools built from a signature (``"3"`` is not an ``int``, unknown fields are
   rejected), :func:`~dsv32.agent.schema.check_arguments` for explicit schemas;
4. the function returns within its timeout (``timeout``) without raising (``exception``).

A result that is not a string is written as JSON (pydantic models with ``model_dump_json``); output
longer than ``max_output_chars`` keeps its head and ends with a marker saying how much was cut.

Timeouts run the function in a daemon worker thread and stop *waiting* after ``timeout_s``. Python
cannot kill a thread: a timed-out tool keeps running in the background until it returns, and its
result is dropped. Tools that may hang for good should enforce their own limits (a subprocess with
a timeout, a sandbox) — the worker-thread timeout only protects the loop.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from dsv32.agent.errors import AgentError
from dsv32.agent.schema import check_arguments, function_schema, pydantic_problems

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_OUTPUT_CHARS = 20_000


@dataclass
class Tool:
    """A callable with its OpenAI function schema. Build one with :func:`tool`."""

    name: str
    description: str
    parameters: dict
    fn: Callable[..., Any]
    #: The pydantic model that validates calls (tools from a signature); None: ``parameters`` does.
    model: type[BaseModel] | None = None
    #: This tool's timeout, overriding the toolbox's; ``None`` = the toolbox's.
    timeout_s: float | None = None

    @property
    def schema(self) -> dict:
        """``{"type": "function", "function": {"name", "description", "parameters"}}``."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def validate(self, arguments: dict) -> tuple[dict | None, list[str]]:
        """``(keyword arguments for fn, [])`` or ``(None, problems)``."""
        if self.model is not None:
            try:
                parsed = self.model.model_validate_json(json.dumps(arguments), strict=True)
            except ValidationError as err:
                return None, pydantic_problems(err)
            return {name: getattr(parsed, name) for name in type(parsed).model_fields}, []
        problems = check_arguments(arguments, self.parameters)
        return (None, problems) if problems else (arguments, [])


def _explicit_schema(schema: dict, fallback_name: str) -> tuple[str, str, dict]:
    """``(name, description, parameters)`` from an OpenAI tool, its ``function`` part, or bare
    ``parameters`` (a JSON schema with ``"type": "object"``)."""
    if not isinstance(schema, dict):
        raise AgentError(f"tool {fallback_name!r}: schema must be a dict, got {type(schema).__name__}")
    function = schema.get("function", schema) if schema.get("type") == "function" else schema
    if "parameters" in function or "name" in function:
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        name, description = function.get("name") or fallback_name, function.get("description", "")
    elif function.get("type") == "object":
        parameters, name, description = function, fallback_name, ""
    else:
        raise AgentError(
            f"tool {fallback_name!r}: schema= must be an OpenAI tool, its 'function' part, or a JSON "
            'schema with "type": "object"'
        )
    if parameters.get("type") != "object":
        raise AgentError(f"tool {name!r}: parameters must be a JSON schema of type 'object'")
    return name, description, parameters


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    schema: dict | None = None,
    timeout_s: float | None = None,
) -> Any:
    """Make ``fn`` a :class:`Tool`; usable as ``@tool``, ``@tool(timeout_s=5)`` or ``tool(fn, schema=...)``.

    Without ``schema`` the parameters come from the type hints and the docstring (see
    :func:`~dsv32.agent.schema.function_schema`); with it, calls are checked against that schema and
    ``fn`` receives the arguments as keywords.
    """

    def build(f: Callable[..., Any]) -> Tool:
        if not callable(f):
            raise AgentError(f"a tool needs a callable, got {type(f).__name__}")
        fallback = name or getattr(f, "__name__", "") or type(f).__name__
        if schema is not None:
            tool_name, desc, parameters = _explicit_schema(schema, fallback)
            return Tool(name or tool_name, description or desc, parameters, f, None, timeout_s)
        desc, parameters, model = function_schema(f, fallback)
        return Tool(
            fallback, description if description is not None else desc, parameters, f, model, timeout_s
        )

    return build if fn is None else build(fn)


def as_tool(obj: Tool | Callable[..., Any]) -> Tool:
    return obj if isinstance(obj, Tool) else tool(obj)


@dataclass
class ToolOutput:
    """What one call produced: ``content`` is what the model sees (the result or the error text)."""

    content: str
    ok: bool
    error: str | None = None
    latency_s: float = 0.0
    truncated: bool = False
    output_chars: int = 0


def format_output(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(value, ensure_ascii=False, default=str)


def truncate(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters plus a marker naming the original length."""
    if limit <= 0 or len(text) <= limit:
        return text, False
    return text[
        :limit
    ] + f"\n[... output truncated: showing the first {limit} of {len(text)} characters]", True


class Toolbox:
    """The tools of an agent, executed one call at a time (see the module docstring)."""

    def __init__(
        self,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        *,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    ) -> None:
        self.tools: dict[str, Tool] = {}
        for obj in tools:
            t = as_tool(obj)
            if t.name in self.tools:
                raise AgentError(f"two tools are named {t.name!r}; tool names must be unique")
            self.tools[t.name] = t
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.schemas = [t.schema for t in self.tools.values()]

    def execute(self, call: dict) -> ToolOutput:
        """Run one OpenAI-style tool call ``{"function": {"name", "arguments"}}``; never raises for a
        bad call or a failing tool."""
        start = time.perf_counter()
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        output = self._execute(name, function.get("arguments") if isinstance(function, dict) else None)
        output.latency_s = time.perf_counter() - start
        return output

    def _execute(self, name: Any, raw: Any) -> ToolOutput:
        if not isinstance(name, str) or name not in self.tools:
            known = ", ".join(self.tools) or "none"
            return _error("unknown_tool", f"unknown tool {name!r}. The available tools are: {known}.")
        t = self.tools[name]
        arguments, problem = _arguments(raw)
        if problem:
            return _error("bad_json", f"the arguments of {name} {problem}. Send a JSON object.")
        kwargs, problems = t.validate(arguments)
        if problems:
            listed = "\n".join(f"- {p}" for p in problems)
            return _error(
                "invalid_arguments",
                f"invalid arguments for {name}:\n{listed}\nCall it again with arguments that match its schema.",
            )
        timeout = t.timeout_s if t.timeout_s is not None else self.timeout_s
        status, value = _call(t.fn, kwargs, timeout)
        if status == "timeout":
            return _error(
                "timeout", f"{name} did not finish within {timeout:g} s and was abandoned (timed out)."
            )
        if status == "exception":
            return _error("exception", f"{name} raised {type(value).__name__}: {shown(value)}")
        try:
            text = format_output(value)
        except Exception as err:  # a circular structure, a __repr__ that raises, ...
            return _error(
                "unreadable_result",
                f"{name} returned a {type(value).__name__} that cannot be written as text "
                f"({type(err).__name__}: {shown(err)}).",
            )
        text, cut = truncate(text, self.max_output_chars)
        return ToolOutput(text, True, None, truncated=cut, output_chars=len(text))


def shown(value: Any) -> str:
    """``str(value)``, or a placeholder when even that raises."""
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__name__} that cannot be shown>"


def _error(kind: str, text: str) -> ToolOutput:
    content = f"Error: {text}"
    return ToolOutput(content, False, kind, output_chars=len(content))


def _arguments(raw: Any) -> tuple[dict, str | None]:
    """``(arguments, None)`` or ``({}, what is wrong)``."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None
    if isinstance(raw, dict):
        return raw, None
    if not isinstance(raw, str):
        return {}, f"are a {type(raw).__name__}, not a JSON object string"
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as err:
        return {}, f"are not valid JSON ({err})"
    if not isinstance(value, dict):
        return {}, f"must be a JSON object, got a JSON {type(value).__name__}"
    return value, None


def _call(fn: Callable[..., Any], kwargs: dict, timeout: float | None) -> tuple[str, Any]:
    """``("ok", value)``, ``("exception", err)`` or ``("timeout", None)``."""
    if timeout is None:
        try:
            return "ok", fn(**kwargs)
        except (Exception, SystemExit) as err:  # a failing tool is reported to the model, not raised
            return "exception", err
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn(**kwargs)
        except (Exception, SystemExit) as err:  # reported to the model
            box["error"] = err

    worker = threading.Thread(target=target, daemon=True, name="dsv32-tool")
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return "timeout", None
    if "error" in box:
        return "exception", box["error"]
    if "value" not in box:  # the thread ended by another BaseException of the tool
        return "exception", RuntimeError("the tool exited without returning")
    return "ok", box["value"]
