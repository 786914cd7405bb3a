"""dsv32.agent's OpenAIBackend runs an episode against the server: the scripted tiny V3.2 model calls
two tools, the agent runs them and sends the results back, and the model answers."""

from __future__ import annotations

import pytest
from helpers import v32_model as V

agent = pytest.importorskip("dsv32.agent")


@pytest.mark.parametrize("stream", [False, True])
def test_openai_backend_runs_an_episode(v32_server, stream):
    results = dict(zip(("get_weather", "get_time"), V.RESULTS))
    seen = []

    def make(name):
        def run(**arguments):
            seen.append((name, arguments))
            return results[name]

        return run

    tools = [agent.tool(make(t["function"]["name"]), schema=t) for t in V.TOOLS]
    backend = agent.OpenAIBackend(
        v32_server.base_url, "tiny-v32", stream=stream, max_retries=0, temperature=0
    )
    trajectory = agent.Agent(backend, tools, system=V.QUESTION[0]["content"], thinking=True).run(
        V.QUESTION[1]["content"]
    )
    assert seen == [(name, args) for name, args in V.CALLS]
    assert trajectory.stop_reason == "answer" and trajectory.final == V.ANSWER
