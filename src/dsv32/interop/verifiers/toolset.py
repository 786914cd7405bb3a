"""A dsv32 environment's tools as a verifiers tool server (MCP), one sandboxed environment per rollout.

verifiers launches this module (``python -m dsv32.interop.verifiers.toolset``) for each rollout of a
:class:`~dsv32.interop.verifiers.taskset.DSV32Task`; the server fetches the rollout's task data over
verifiers' task channel, resets a fresh environment on it, and answers MCP ``tools/list`` with the
environment's schemas and ``tools/call`` with ``env.call`` after the same validation and time bounds
as dsv32's agent loop (:class:`~dsv32.agent.tools.Toolbox`): a bad call is an error result the model
reads, never a failure of the server. Tool names are bare (``python``), as in dsv32. The environment
is closed with the server.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import verifiers.v1 as vf
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, TextContent, Tool

from dsv32.agent.episode import env_tools
from dsv32.agent.tools import Toolbox
from dsv32.envs.base import Environment, Task, get_env


class DSV32ToolsetConfig(vf.ToolsetConfig):
    """Placement of the tool server (verifiers' ``runtime``, ``colocated``, ``url``)."""


class DSV32Toolset(vf.Toolset[DSV32ToolsetConfig]):
    """The tools of the rollout's dsv32 environment."""

    TOOL_PREFIX = None  # the model calls `python`, not `dsv32_toolset_python`

    def __init__(self, config: DSV32ToolsetConfig) -> None:
        super().__init__(config)
        self.env: Environment | None = None
        self.toolbox: Toolbox | None = None
        self.schemas: list[dict] = []
        self._lock = asyncio.Lock()  # one call at a time, as in an episode

    async def setup_task(self, data: Any) -> None:
        env = get_env(data.env).factory(**data.options)
        self._exit_stack.callback(env.close)
        await asyncio.to_thread(env.reset, Task.from_dict(data.row))
        self.env, self.schemas, self.toolbox = env, env.tools(), Toolbox(env_tools(env))

    def register(self, mcp: MCPServer) -> None:
        # MCPServer's protocol handlers call these methods: the catalog is the environment's own.
        server = cast(Any, mcp)
        server.list_tools = self.list_tools
        server.call_tool = self.call_tool

    async def list_tools(self) -> list[Tool]:
        tools = []
        for schema in self.schemas:
            function = schema.get("function", schema)
            parameters = function.get("parameters") or {"type": "object", "properties": {}}
            tools.append(
                Tool(
                    name=function["name"],
                    description=function.get("description", ""),
                    input_schema=parameters,
                )
            )
        return tools

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context | None = None
    ) -> CallToolResult:
        if self.toolbox is None:
            text = "Error: this tool server has no task (it was started without verifiers' task channel)"
            return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
        async with self._lock:
            output = await asyncio.to_thread(
                self.toolbox.execute, {"function": {"name": name, "arguments": arguments or {}}}
            )
        return CallToolResult(content=[TextContent(type="text", text=output.content)], is_error=not output.ok)


if __name__ == "__main__":
    DSV32Toolset.run()
