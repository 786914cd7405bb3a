"""The dsv32 environments as a verifiers taskset, through verifiers' own API: its loader finds the
``dsv32-envs`` plugin, the rows carry verifiers' columns, the tools are an MCP tool server, and the
task's rubric scores a hand-built reference trace 1 and a wrong one 0 (as dsv32 scores them)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("verifiers.v1", reason="verifiers is not installed (pip install 'dsv32[verifiers]')")

import verifiers.v1 as vf
from verifiers.v1.utils.loaders import default_harness_id, taskset_class

from dsv32.envs import Task, get_env, replay, resolve_tasks
from dsv32.interop.verifiers import (
    DSV32Harness,
    DSV32Task,
    DSV32Taskset,
    DSV32Toolset,
    load_environment,
    trace_of,
)

NATIVE = resolve_tasks("code-interpreter", "smoke")[0]


@pytest.fixture(scope="module")
def vf_env():
    return vf.load_environment(
        vf.resolve_env_config({"taskset": {"id": "dsv32-envs", "env": "code-interpreter", "split": "smoke"}})
    )


def first_task(env: vf.Env) -> DSV32Task:
    return next(iter(env.taskset.take(1)))


def test_verifiers_finds_the_plugin_and_its_harness(vf_env):
    assert taskset_class("dsv32-envs") is DSV32Taskset
    assert default_harness_id("dsv32-envs") == "dsv32-envs"
    assert isinstance(vf.load_harness(vf_env._default_harness), DSV32Harness)
    assert isinstance(vf_env, vf.SingleAgentEnv) and isinstance(vf_env.taskset, DSV32Taskset)
    ours = load_environment("code-interpreter", "smoke", options={"cell_timeout_s": 5})
    assert ours.taskset.config.options == {"cell_timeout_s": 5} and ours.taskset.config.split == "smoke"


def test_rows_carry_verifiers_columns(vf_env):
    task = first_task(vf_env)
    assert isinstance(task, DSV32Task)
    data = task.data
    assert (data.id, data.prompt, data.answer, data.task) == (
        NATIVE.id,
        NATIVE.prompt,
        NATIVE.answer,
        "code-interpreter",
    )
    assert data.info == NATIVE.info and data.row == NATIVE.to_dict()
    assert data.system_prompt.startswith("You can run Python")
    assert task.key == f"code-interpreter/{NATIVE.id}"
    assert [type(t) for t in DSV32Task.toolsets(task.config)] == [DSV32Toolset]


def test_the_rubric_scores_the_reference_1_and_a_wrong_answer_0(vf_env):
    task = first_task(vf_env)
    env = get_env("code-interpreter").factory()
    try:
        replies = env.reference(NATIVE)
        native = replay(env, NATIVE, replies)  # the conversation a rollout of the reference records
        native_value = env.reward(native).value
    finally:
        env.close()
    reference = trace_of(task, native.messages, native.final)
    asyncio.run(task.score(reference))
    assert reference.rewards["dsv32"].score == native_value == 1.0
    assert reference.metrics == {"dsv32_boxed": 1.0, "dsv32_correct": 1.0}

    wrong_messages = [*native.messages[:-1], {"role": "assistant", "content": "The answer is \\boxed{12}."}]
    wrong = trace_of(task, wrong_messages, wrong_messages[-1]["content"])
    asyncio.run(task.score(wrong))
    assert wrong.reward == 0.0 and "differs" in wrong.info["dsv32"]["reason"]


def test_the_tool_server_answers_as_the_agent_loop_does(vf_env):
    data = first_task(vf_env).data

    async def session():
        toolset = DSV32Toolset(DSV32Task.config_type()().tools)
        async with toolset._exit_stack:  # what verifiers' server enters around a rollout
            await toolset.setup_task(data)
            tools = await toolset.list_tools()
            ok = await toolset.call_tool("python", {"code": "6 * 7"})
            bad = await toolset.call_tool("python", {"cell": "1"})
            env = toolset.env
        return tools, ok, bad, env

    tools, ok, bad, env = asyncio.run(session())
    assert [t.name for t in tools] == ["python"] and "code" in tools[0].input_schema["properties"]
    assert (ok.content[0].text, ok.is_error) == ("42", False)
    assert bad.is_error and "invalid arguments" in bad.content[0].text
    assert env.kernel is None  # the environment closed with the server
    assert Task.from_dict(data.row) == NATIVE
