"""An agent role of a synthesis pipeline: a backend with its prompt, sampling and price, and how
its usage is booked. Shared by the search-QA pipeline and the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dsv32.agent import Agent, Tool
from dsv32.synth.records import Pricing, RoleUsage, SynthError


@dataclass
class AgentSpec:
    """One configured agent. ``system`` replaces the environment's system prompt (None keeps it);
    ``model`` names the generator in provenance; ``retry_errors``: its backend failures are outages
    to retry (an endpoint), not the agent's own result (a local model filling its window)."""

    name: str
    backend: Any
    model: str = ""
    system: str | None = None
    sampling: dict = field(default_factory=dict)
    max_steps: int = 20
    thinking: bool = True
    pricing: Pricing | None = None
    retry_errors: bool = True

    def __post_init__(self) -> None:
        if not self.name or self.max_steps < 1:
            raise SynthError(f"agent {self.name!r}: needs a name and max_steps >= 1")

    def run(self, messages: list[dict], tools: list[Tool], usage: RoleUsage, role: str | None = None) -> Any:
        """Run the agent on ``messages`` (its ``system`` put first when set) and book its tokens."""
        if self.system is not None:
            messages = [{"role": "system", "content": self.system}] + [
                m for m in messages if m["role"] != "system"
            ]
        agent = Agent(
            self.backend, tools, thinking=self.thinking, max_steps=self.max_steps, sampling=self.sampling
        )
        trajectory = agent.run(messages)
        usage.role(role or self.name, self.pricing).add_trajectory(trajectory)
        return trajectory

    def failed(self, trajectory: Any) -> bool:
        """Whether ``trajectory`` ended in a backend failure that should make its job run again."""
        return self.retry_errors and trajectory.stop_reason == "error"

    def complete(self, messages: list[dict], usage: RoleUsage, role: str | None = None) -> str:
        """One model call without tools (chat mode); its text."""
        completion = self.backend.complete(messages, [], thinking=False, sampling=self.sampling)
        u = completion.usage
        usage.role(role or self.name, self.pricing).add(u.prompt_tokens, u.completion_tokens, u.cached_tokens)
        return completion.message.get("content") or ""
