"""Cold-start system prompts (paper §3.2.2, Appendix B, Tables 6-8).

Before RL, V3.2 had reasoning data without tools and agent data without reasoning. Carefully
written system prompts made the model combine the two; the occasional good trajectory bootstraps
RL. Three families:

- **reasoning** (Table 6): think inside ``<think></think>``, answer after ``</think>``;
- **agent** (Table 7): tool-use guidance, no thinking;
- **reasoning-required agent** (Table 8): call tools *during* the reasoning (at most N code
  executions), then a final answer with no tool calls.

``{TOOL-DESCRIPTIONS}`` becomes one JSON schema per line (as in the ``<functions>`` block) and
``{TOOLCALL-FORMAT}`` the DSML call syntax with its value rules. The paper prints the prompts as
running text; the line breaks here (one per bullet and section) are our reading of them. Use the
result as the *content* of the system message and do not also attach ``tools`` to it, or the tool
list appears twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from dsv32.chat import protocol as P
from dsv32.chat.encode import tool_schemas_text

#: §4.1's prompt for math benchmarks (``.format(question=...)``); RL math tasks and eval use it.
MATH_PROMPT = "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."

#: Table 6's task statement (competitive programming); pass your own for other domains.
PROGRAMMING_TASK = (
    "You are an expert Python programmer. You will be given a question (problem specification) and "
    "will generate a correct Python program that matches the specification and passes all tests."
)
REASONING_INSTRUCTION = (
    "Please first reason before giving the final answer. The reasoning process enclosed within "
    "<think> </think>. The final answer is output after the </think> tag."
)


def toolcall_format() -> str:
    """{TOOLCALL-FORMAT}: the DSML syntax and how values are written."""
    return P.TOOL_CALL_FORMAT + "\n\n" + P.TOOL_VALUE_RULES


def tools_section(tools: Sequence[Mapping[str, Any]]) -> str:
    """The ``## Tools`` section shared by the two agent prompts."""
    if not tools:
        raise ValueError("an agent system prompt needs at least one tool (OpenAI function format)")
    return (
        "## Tools\n\nYou have access to the following tools:\n"
        + tool_schemas_text(tools)
        + "\n\nImportant: ALWAYS adhere to this exact format for tool use:\n"
        + toolcall_format()
    )


def reasoning_system_prompt(task: str = PROGRAMMING_TASK) -> str:
    """Table 6: the task statement, then the instruction to reason in ``<think>`` first."""
    return f"{task} {REASONING_INSTRUCTION}"


def python_tool_guidance(timeout_s: float = 120.0) -> str:
    """Table 7's guidance for the stateful Jupyter (code interpreter) tool."""
    return (
        "Use Python interpreter tool to execute Python code. The code will not be shown to the user. "
        "This tool should be used for internal reasoning, but not for code that is intended to be "
        "visible to the user (e.g. when creating plots, tables, or files). When you send a message "
        "containing Python code to python, it will be executed in a stateful Jupyter notebook "
        f"environment. python will respond with the output of the execution or time out after "
        f"{float(timeout_s)} seconds."
    )


def agent_system_prompt(tools: Sequence[Mapping[str, Any]], guidance: str | None = None) -> str:
    """Table 7: tool guidance (default: the Python interpreter's), then the tools and call format."""
    return (guidance if guidance is not None else python_tool_guidance()) + "\n\n" + tools_section(tools)


def reasoning_agent_system_prompt(tools: Sequence[Mapping[str, Any]], max_code_executions: int = 20) -> str:
    """Table 8: call tools inside ``<think>`` (at most ``max_code_executions``), answer without tools."""
    if max_code_executions < 1:
        raise ValueError(f"max_code_executions must be at least 1, got {max_code_executions}")
    return (
        "You are a helpful assistant with access to a Python interpreter.\n"
        "- You may use the Python tool **multiple times** during your reasoning, a.k.a in "
        f"<think></think>, with a maximum of {max_code_executions} code executions.\n"
        "- Call the Python tool early in your reasoning to aid in solving the task. Continue reasoning "
        "and invoking tools as needed until you reach the final answer. Once you have the answer, stop "
        "reasoning and present your solution using Markdown and LaTeX.\n"
        "- Do NOT invoke any tools in your presented final solution steps.\n"
        "- To improve efficiency and accuracy, you should prefer code execution over language-based "
        "reasoning whenever possible. Keep your reasoning succinct; let the code do the heavy lifting.\n\n"
        + tools_section(tools)
    )


def cold_start_system_prompt(
    kind: Literal["reasoning", "agent", "reasoning_agent"],
    tools: Sequence[Mapping[str, Any]] | None = None,
    **options: Any,
) -> str:
    """Dispatch on ``kind``; ``options`` go to the matching function (``task``, ``guidance``,
    ``max_code_executions``)."""
    if kind == "reasoning":
        if tools:
            raise ValueError("the reasoning prompt takes no tools; use kind='reasoning_agent'")
        return reasoning_system_prompt(**options)
    if kind == "agent":
        return agent_system_prompt(tools or [], **options)
    if kind == "reasoning_agent":
        return reasoning_agent_system_prompt(tools or [], **options)
    raise ValueError(f"kind must be 'reasoning', 'agent' or 'reasoning_agent', got {kind!r}")


#: The system prompts an agent episode can start with (cold-start synthesis and agentic RL offer the
#: same choice): ``reasoning_agent``: Table 8 (call tools inside the reasoning; the tools and the DSML
#: call format in the prompt text); ``agent``: Table 7 (the Jupyter tool guidance); ``env``: the
#: environment's own system prompt, its tools attached (V3.2 renders them as the ``## Tools`` block);
#: ``bare``: the environment's own prompt only (it names its tools in words).
EPISODE_PROMPTS = ("reasoning_agent", "agent", "env", "bare")


def episode_system_message(
    kind: str, env_system: str, tools: Sequence[Mapping[str, Any]], max_code_executions: int = 20
) -> dict[str, str]:
    """The system message of prompt ``kind`` (:data:`EPISODE_PROMPTS`) for an environment whose own
    system prompt is ``env_system`` and whose tool schemas are ``tools``."""
    if kind == "reasoning_agent":
        return {"role": "system", "content": reasoning_agent_system_prompt(tools, max_code_executions)}
    if kind == "agent":
        return {"role": "system", "content": agent_system_prompt(tools)}
    if kind in ("env", "bare"):
        return {"role": "system", "content": env_system}
    raise ValueError(f"prompt {kind!r} is not one of {', '.join(EPISODE_PROMPTS)}")
