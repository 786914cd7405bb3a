"""The V3.2 conversation protocol (paper §3.2): pure Python, no torch.

- :func:`encode_messages` -- OpenAI-style messages (system, user, developer, assistant, tool;
  ``tools``, ``response_format``, ``tool_calls``, ``reasoning_content``) to the exact prompt text the
  released model was trained on; ``context=`` encodes only new messages (incremental rollouts);
  :class:`IncrementalEncoder` renders a growing conversation, re-rendering only what changed.
- :func:`parse_completion` -- a completion back to an assistant message; strict (raises
  :class:`ParseError`) or lenient (recovers and lists ``problems``).
- :func:`apply_thinking_context` -- the thinking context rule of §3.2.1.
- Cold-start system prompts of Appendix B: :func:`reasoning_system_prompt`,
  :func:`agent_system_prompt`, :func:`reasoning_agent_system_prompt`.
- :func:`tokenize_conversation` -- ``(input_ids, loss_mask)`` for training;
  :func:`add_v32_special_tokens` for tokenizers that lack the V3.2 tokens.
- :func:`chat_template` -- the same rules as a Jinja template for transformers / vLLM.
- :func:`strip_special_tokens` / :func:`strip_tool_results` -- special-token strings removed from
  untrusted text (tool results) before it is tokenized.
"""

from dsv32.chat.context import (
    apply_thinking_context,
    attach_tools,
    conversation_from_json,
    last_user_index,
)
from dsv32.chat.encode import (
    IncrementalEncoder,
    Segment,
    encode_messages,
    render_segments,
    render_tools,
)
from dsv32.chat.errors import ConversationError, ParseError
from dsv32.chat.jinja import chat_template, messages_for_template
from dsv32.chat.parse import parse_completion
from dsv32.chat.protocol import (
    ASSISTANT,
    BOS,
    DSML,
    EOS,
    SPECIAL_TOKENS,
    THINK_END,
    THINK_START,
    USER,
)
from dsv32.chat.templates import (
    agent_system_prompt,
    cold_start_system_prompt,
    reasoning_agent_system_prompt,
    reasoning_system_prompt,
)
from dsv32.chat.tokenize import (
    TokenizerError,
    add_v32_special_tokens,
    missing_special_tokens,
    tokenize_conversation,
)
from dsv32.chat.untrusted import (
    ToolResultStripper,
    strip_special_tokens,
    strip_tool_results,
    tokenizer_special_tokens,
)

__all__ = [
    "ASSISTANT",
    "BOS",
    "DSML",
    "EOS",
    "SPECIAL_TOKENS",
    "THINK_END",
    "THINK_START",
    "USER",
    "ConversationError",
    "IncrementalEncoder",
    "ParseError",
    "Segment",
    "TokenizerError",
    "ToolResultStripper",
    "add_v32_special_tokens",
    "agent_system_prompt",
    "apply_thinking_context",
    "attach_tools",
    "chat_template",
    "cold_start_system_prompt",
    "conversation_from_json",
    "encode_messages",
    "last_user_index",
    "messages_for_template",
    "missing_special_tokens",
    "parse_completion",
    "reasoning_agent_system_prompt",
    "reasoning_system_prompt",
    "render_segments",
    "render_tools",
    "strip_special_tokens",
    "strip_tool_results",
    "tokenize_conversation",
    "tokenizer_special_tokens",
]
