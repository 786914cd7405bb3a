"""The fixed strings of the V3.2 conversation format: special tokens, DSML tags and prompt texts.

Everything that the encoder writes, the parser reads and the Jinja template embeds is defined here
once. The texts are the released model's (see the conformance fixture in ``tests/chat/fixtures``);
changing a single character changes the prompt the model sees.

Layout of one conversation (thinking mode, ``L`` = index of the last user/developer message)::

    BOS system [\\n\\n TOOLS_PROMPT] [\\n\\n RESPONSE_FORMAT]
    <｜User｜>user text<｜Assistant｜></think>          user turns before L close the think block
    answer [\\n\\n DSML function_calls] EOS            earlier assistant turns: no reasoning
    <｜User｜>user text<｜Assistant｜><think>           the user turn L opens it
    reasoning</think>answer [\\n\\n DSML calls] EOS     assistant turns after L keep their reasoning
    \\n\\n<function_results>\\n<result>…</result>…\\n</function_results>\\n\\n<think>
"""

from __future__ import annotations

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_START = "<think>"
THINK_END = "</think>"
DSML = "｜DSML｜"

#: The tokens a tokenizer must know as single, never-split tokens (see ``tokenize.py``).
SPECIAL_TOKENS: tuple[str, ...] = (BOS, EOS, USER, ASSISTANT, THINK_START, THINK_END)
#: Also added to tokenizers that lack them, so that tool-call markup is never split or merged.
EXTRA_TOKENS: tuple[str, ...] = (DSML,)

#: Strings that may not appear inside generated reasoning or content: the model emitting one of them
#: means the output is not a single well-formed assistant turn.
FORBIDDEN_IN_TEXT: tuple[str, ...] = (BOS, EOS, USER, ASSISTANT, THINK_START, THINK_END, DSML)

# --- DSML tool calls -------------------------------------------------------------------------------

CALLS_OPEN = f"<{DSML}function_calls>"
CALLS_CLOSE = f"</{DSML}function_calls>"
INVOKE_OPEN = f'<{DSML}invoke name="'  # + NAME + '">\n'
INVOKE_CLOSE = f"</{DSML}invoke>"
PARAM_OPEN = f'<{DSML}parameter name="'  # + KEY + '" string="true|false">' + VALUE
PARAM_CLOSE = f"</{DSML}parameter>"
#: What separates the answer text from the tool-call block in an assistant turn.
CALLS_START = "\n\n" + CALLS_OPEN

# --- tool results ----------------------------------------------------------------------------------

RESULTS_OPEN = "\n\n<function_results>"
RESULT_OPEN = "\n<result>"
RESULT_CLOSE = "</result>"
RESULTS_CLOSE = "\n</function_results>"

# --- developer turns -------------------------------------------------------------------------------

DEVELOPER_MESSAGE_PREFIX = "\n\n# The user's message is: "

# --- system-prompt blocks --------------------------------------------------------------------------

#: The tool-call syntax as shown to the model (also the cold-start templates' {TOOLCALL-FORMAT}).
TOOL_CALL_FORMAT = (
    f"{CALLS_OPEN}\n"
    f'{INVOKE_OPEN}$FUNCTION_NAME">\n'
    f'{PARAM_OPEN}$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE{PARAM_CLOSE}\n'
    "...\n"
    f"{INVOKE_CLOSE}\n"
    f'{INVOKE_OPEN}$FUNCTION_NAME2">\n'
    "...\n"
    f"{INVOKE_CLOSE}\n"
    f"{CALLS_CLOSE}"
)

#: How parameter values are written (strings raw, everything else JSON).
TOOL_VALUE_RULES = (
    "String and scalar parameters should be specified as is without any escaping or quotes, while "
    'lists and objects should use JSON format. The "string" attribute should be set to "true" for '
    'string type parameters and "false" for other types (numbers, booleans, arrays, objects).'
)

#: The ``## Tools`` block appended to a system (or developer) turn, up to the tool schemas.
TOOLS_PROMPT_HEAD = (
    "## Tools\n\n"
    "You have access to a set of tools you can use to answer the user's question.\n"
    f'You can invoke functions by writing a "{CALLS_OPEN}" block like the following as part of '
    "your reply to the user:\n"
    f"{TOOL_CALL_FORMAT}\n\n"
    f"{TOOL_VALUE_RULES}\n\n"
    "If the thinking_mode is enabled, then after function results you should strongly consider "
    "outputting a thinking block. Here is an example:\n\n"
    f"{CALLS_OPEN}\n...\n{CALLS_CLOSE}\n\n"
    "<function_results>\n...\n</function_results>\n\n"
    f"{THINK_START}...thinking about results{THINK_END}\n\n"
    "Here are the functions available in JSONSchema format:\n"
    "<functions>\n"
)
#: After the tool schemas (one JSON object per line).
TOOLS_PROMPT_TAIL = "\n</functions>\n"

#: Appended to a system (or developer) turn that carries ``response_format``; then the JSON schema.
RESPONSE_FORMAT_HEAD = "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
