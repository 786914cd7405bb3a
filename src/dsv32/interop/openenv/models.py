"""The OpenEnv wire types of a served dsv32 environment: one action, one observation, one state.

An action is what one assistant turn does, one tool call at a time:

- ``{"type": "call_tool", "tool_name": "python", "arguments": {"code": "2**10"}}`` runs one tool
  call (``arguments`` an object, or the JSON string a model wrote, as OpenAI tool calls carry it);
- ``{"type": "final_answer", "content": "... \\boxed{42}"}`` ends the episode: the dsv32 verifier
  scores the conversation and the observation carries ``done`` and ``reward``;
- ``{"type": "list_tools"}`` lists the tools again (``reset`` already did).

The ``type`` values and ``tool_name`` / ``arguments`` follow OpenEnv's MCP actions (``CallToolAction``,
``ListToolsAction``), and tools are OpenEnv's MCP :class:`Tool` specs. A bad action — an unknown tool,
arguments that do not fit its schema, a step before ``reset`` or after ``done`` — is answered with an
observation whose ``error`` names what was wrong (:class:`ActionError`); a payload that is not an
action at all (an unknown ``type``, an unknown field) is refused by OpenEnv's own validation as a
``VALIDATION_ERROR`` message. Neither ends the session.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from openenv.core.env_server.mcp_types import Tool
from openenv.core.env_server.types import Action, Observation, State
from pydantic import BaseModel, Field


class DSV32Action(Action):
    """One tool call, the final answer, or a request for the tool list."""

    type: Literal["call_tool", "final_answer", "list_tools"] = Field(
        description="call_tool (tool_name, arguments), final_answer (content) or list_tools"
    )
    tool_name: str | None = Field(default=None, description="call_tool: the tool to call")
    arguments: dict[str, Any] | str | None = Field(
        default=None, description="call_tool: a JSON object, or the JSON text a model wrote"
    )
    content: str | None = Field(default=None, description="final_answer: the assistant's final message")
    reasoning_content: str | None = Field(
        default=None, description="optional: the reasoning of the turn, kept in the conversation"
    )


class ErrorCode(StrEnum):
    """Why an action was not carried out; the first six are the agent loop's own kinds of bad calls
    (:class:`~dsv32.agent.tools.Toolbox`), so a served environment answers as the agent loop does."""

    UNKNOWN_TOOL = "unknown_tool"
    BAD_JSON = "bad_json"
    INVALID_ARGUMENTS = "invalid_arguments"
    TOOL_TIMEOUT = "timeout"
    TOOL_RAISED = "exception"
    UNREADABLE_RESULT = "unreadable_result"
    INVALID_ACTION = "invalid_action"
    NO_EPISODE = "no_episode"
    EPISODE_DONE = "episode_done"
    UNKNOWN_TASK = "unknown_task"
    ENVIRONMENT_ERROR = "environment_error"


class ActionError(BaseModel):
    """What was wrong with an action: a code to branch on and the text a model would read."""

    code: ErrorCode
    message: str


class DSV32Observation(Observation):
    """What the environment answers. ``reset``: ``messages`` (the system prompt and the task,
    OpenAI-style) and ``tools``; ``call_tool``: ``result`` (what the model reads next; an ``error:``
    text of the tool itself stays here); ``final_answer``: ``done``, ``reward`` (None when the verifier
    could not score: ``scored`` False), ``reward_components`` and ``reason``."""

    task_id: str | None = None
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[Tool] = Field(default_factory=list)
    tool_name: str | None = None
    result: str | None = None
    error: ActionError | None = None
    reward_components: dict[str, float] = Field(default_factory=dict)
    reason: str | None = None
    scored: bool | None = None


class DSV32State(State):
    """The session's episode: the environment, the task, how many actions, whether it is done,
    and the dsv32 environment's own ``state()``."""

    env: str = ""
    task_id: str | None = None
    done: bool = False
    reward: float | None = None
    env_state: dict[str, Any] = Field(default_factory=dict)


ACTION_TYPES = ("call_tool", "final_answer", "list_tools")
"""The ``type`` values of :class:`DSV32Action`; a client recognises a dsv32 server by the
``final_answer`` among them in ``/schema``."""
