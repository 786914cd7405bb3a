"""What the loop makes of a reply besides its tool calls: a tool call the model meant to make but that
could not be read.

A backend parses the model's text into an assistant message and lists what it could not parse as
``problems`` (:func:`dsv32.chat.parse_completion` in lenient mode; each problem names the ``part``
of the turn it is in). A reply *attempted a call that could not be read* when

- a problem is in a tool-call block (``part == "tool_calls"``: an unclosed tag, an empty tool name,
  a parameter given twice, a ``string="false"`` value that is not JSON, ...), or
- its content still holds tool-call markup (V3.2's DSML tag, or the ``<tool_call>`` tag of the
  template convention): a block the parser did not recognize as one (a single newline before
  ``function_calls``), or one an endpoint's tool parser left in the text.

Such a reply is never an answer: the loop tells the model what was wrong (:func:`call_error`) and
it tries again. Other problems do not lose a call, and the reply is read as the parser returned it:
a missing ``</think>``, special tokens in the answer text, or a ``string="false"`` value that is
not JSON (``part == "arguments"``: the call is read with the value as a string, and the toolbox
answers it like any call whose arguments do not fit).
"""

from __future__ import annotations

import re

from dsv32.agent.backends.base import Completion
from dsv32.chat import DSML, strip_special_tokens

#: Tool-call markup that should never be left in a reply's text (V3.2's DSML tag and the
#: ``<tool_call>`` tag of the convention chat templates use: Hermes, Qwen, SmolLM3) and what the
#: model is told about it.
CALL_MARKUP = {
    DSML: "DSML tool-call tags outside a tool-call block (the block follows the text after a blank line)",
    "<tool_call>": "<tool_call> tags that were not read as a tool call",
}
#: What is left of a special-token string cut by the end of a parse problem's excerpt.
_CUT_TOKEN = re.compile(r"<?/?｜[^｜'\"]*(?=['\"]|$)")


def call_problems(problems: list[dict]) -> list[dict]:
    """The problems that are in a tool-call block."""
    return [p for p in problems if p.get("part") == "tool_calls"]


def call_error(completion: Completion) -> str | None:
    """The error message for the model when its reply attempted a tool call that could not be read
    (see the module docstring), else None."""
    problems = call_problems(completion.problems)
    content = completion.message.get("content") or ""
    markup = [name for marker, name in CALL_MARKUP.items() if marker in content]
    if not problems and not markup:
        return None
    read = len(completion.message.get("tool_calls") or [])
    ran = f"the {read} call(s) before it were run" if read else "no tool was run"
    lines = [f"Error: your reply tried to call a tool, but the call could not be read, so {ran}."]
    # Special-token strings would become tokens in the prompt (an end token inside this message):
    # what the parser quotes is shown without them.
    for problem in problems:
        expected, message = problem.get("expected") or "", problem.get("message") or ""
        if expected and expected not in message:  # a message that does not say what was expected
            message = f"expected {expected}" + (f" ({message})" if message else "")
        lines.append(f"- {_CUT_TOKEN.sub('', strip_special_tokens(message))}")
    if markup and not problems:
        lines += [f"- the text of the reply holds {what}" for what in markup]
    lines.append(
        "Write the call again exactly in the tool-call format (every tag closed, each parameter once, "
        "non-string values as JSON), or reply without tool-call markup to give your answer."
    )
    return "\n".join(lines)
