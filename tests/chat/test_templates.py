"""Cold-start system prompts (Appendix B, Tables 6-8)."""

from __future__ import annotations

import json

import pytest

from dsv32.chat import (
    agent_system_prompt,
    cold_start_system_prompt,
    encode_messages,
    reasoning_agent_system_prompt,
    reasoning_system_prompt,
)

PYTHON = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python in a stateful Jupyter notebook",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}


def test_reasoning_prompt_is_table_6():
    assert reasoning_system_prompt() == (
        "You are an expert Python programmer. You will be given a question (problem specification) and will "
        "generate a correct Python program that matches the specification and passes all tests. Please first "
        "reason before giving the final answer. The reasoning process enclosed within <think> </think>. The "
        "final answer is output after the </think> tag."
    )
    assert reasoning_system_prompt("Solve the math problem.").startswith(
        "Solve the math problem. Please first"
    )


def test_agent_prompt_fills_tool_descriptions_and_call_format():
    prompt = agent_system_prompt([PYTHON])
    assert prompt.startswith("Use Python interpreter tool to execute Python code.")
    assert "time out after 120.0 seconds." in prompt
    assert json.dumps(PYTHON["function"]) in prompt  # {TOOL-DESCRIPTIONS}
    assert "Important: ALWAYS adhere to this exact format for tool use:\n<｜DSML｜function_calls>\n" in prompt
    assert prompt.endswith(
        '"false" for other types (numbers, booleans, arrays, objects).'
    )  # {TOOLCALL-FORMAT}
    assert "{" + "TOOL" not in prompt
    assert agent_system_prompt([PYTHON], guidance="Search the web.").startswith("Search the web.\n\n## Tools")


def test_reasoning_agent_prompt_is_table_8():
    prompt = reasoning_agent_system_prompt([PYTHON])
    assert prompt.startswith("You are a helpful assistant with access to a Python interpreter.")
    assert "during your reasoning, a.k.a in <think></think>, with a maximum of 20 code executions." in prompt
    assert "- Do NOT invoke any tools in your presented final solution steps." in prompt
    assert "maximum of 5 code executions" in reasoning_agent_system_prompt([PYTHON], max_code_executions=5)
    assert "## Tools\n\nYou have access to the following tools:\n" in prompt


def test_dispatch_and_errors():
    assert cold_start_system_prompt("reasoning") == reasoning_system_prompt()
    assert cold_start_system_prompt("agent", [PYTHON]) == agent_system_prompt([PYTHON])
    assert cold_start_system_prompt("reasoning_agent", [PYTHON], max_code_executions=3) == (
        reasoning_agent_system_prompt([PYTHON], 3)
    )
    with pytest.raises(ValueError, match="at least one tool"):
        agent_system_prompt([])
    with pytest.raises(ValueError, match="kind"):
        cold_start_system_prompt("planner")
    with pytest.raises(ValueError, match="max_code_executions"):
        reasoning_agent_system_prompt([PYTHON], 0)


def test_a_cold_start_prompt_is_a_system_message():
    messages = [
        {"role": "system", "content": reasoning_agent_system_prompt([PYTHON])},
        {
            "role": "user",
            "content": "Given a linked list, swap every two adjacent nodes and return its head ...",
        },
    ]
    prompt = encode_messages(messages, "thinking")
    assert prompt.count("<functions>") == 0 and prompt.endswith("<｜Assistant｜><think>")


def test_episode_system_messages():
    from dsv32.chat.templates import EPISODE_PROMPTS, episode_system_message

    tools = [
        {"type": "function", "function": {"name": "python", "description": "run code", "parameters": {}}}
    ]
    messages = {kind: episode_system_message(kind, "env prompt", tools) for kind in EPISODE_PROMPTS}
    assert messages["env"] == messages["bare"] == {"role": "system", "content": "env prompt"}
    assert messages["agent"]["content"] == agent_system_prompt(tools)
    assert messages["reasoning_agent"]["content"] == reasoning_agent_system_prompt(tools, 20)
    with pytest.raises(ValueError, match="prompt 'chatty' is not one of reasoning_agent, agent, env, bare"):
        episode_system_message("chatty", "env prompt", tools)
