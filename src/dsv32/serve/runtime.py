"""The served model: weights, tokenizer, and how a chat request becomes a prompt.

A model speaks the V3.2 format when its tokenizer knows the V3.2 special tokens (a native V3.2
checkpoint with its tokenizer, or any model whose tokenizer was given them with
:func:`dsv32.chat.add_v32_special_tokens`). Its prompts are :func:`dsv32.chat.encode_messages` of the
request's messages with the tools attached (thinking mode when ``chat_template_kwargs.thinking``),
and its completions are decoded with special tokens kept, for the parser. Any other model with a chat
template renders and parses as the local agent does, with the same
:class:`~dsv32.agent.backends.formats.TemplateFormat`: the messages through the template
(``chat_template_kwargs`` passed through), the tools given to a template that renders them or else
announced in the system message, and the reply's tool calls read by the model family's tool-call
parser (``--tool-call-parser``: ``hermes``, ``llama3_json``, ``mistral``; by default the one the
template's family writes, see :func:`~dsv32.agent.backends.toolparsers.detect_parser`); its
completions are decoded with special tokens kept (``[TOOL_CALLS]`` and ``<|python_tag|>`` are
special tokens) and without the end token.

Tool results are untrusted text: before the prompt is tokenized, the special-token strings are
removed from the content of ``tool`` messages (:func:`dsv32.chat.strip_tool_results`) — the V3.2
special tokens on a V3.2 model, the tokenizer's own special tokens with a chat template — so a tool
result cannot open a turn of its own. Other messages are the caller's and go in verbatim.

``tool_choice`` on a V3.2 model: ``"none"`` leaves the tools out of the prompt; ``"required"`` and a
named function force the opening of a tool-call block (and the function's name) as the answer's
first tokens — right away in chat mode, right after ``</think>`` in thinking mode — and a named
function is the only tool shown. On a chat-template model the same choices force the parser's
opening of a call (``<tool_call>\n{"name": "`` for ``hermes``, with the name and ``", "arguments": ``
for a named function) as the reply's first text; with thinking on they are refused (the reply may
open with ``<think>``, before which nothing can be forced).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsv32.agent.backends.formats import TemplateFormat
from dsv32.agent.errors import AgentError
from dsv32.chat import (
    ConversationError,
    attach_tools,
    encode_messages,
    missing_special_tokens,
    strip_tool_results,
)
from dsv32.chat import protocol as P
from dsv32.chat.validate import check_conversation
from dsv32.engine.models import ByteTokenizer, LoadedModel, ModelLoadError, load_model
from dsv32.serve.errors import invalid
from dsv32.serve.protocol import ChatCompletionRequest, NamedToolChoice
from dsv32.serve.stream import V32Stream
from dsv32.serve.template_stream import TemplateStream


@dataclass(frozen=True)
class Forced:
    """Text the completion must continue with once its raw text ends with ``trigger`` ("" = at once)."""

    text: str
    trigger: str


@dataclass(frozen=True)
class ChatPrompt:
    text: str
    ids: list[int]
    thinking_mode: str  # "thinking" / "chat" for V3.2 models
    forced: Forced | None = None


class ServedModel:
    """A loaded model and its tokenizer, named ``name`` in the API."""

    def __init__(
        self,
        loaded: LoadedModel,
        name: str,
        max_model_len: int | None = None,
        tool_call_parser: str | None = None,
    ) -> None:
        if loaded.tokenizer is None:
            raise ModelLoadError(f"model {loaded.source!r} has no tokenizer: save one beside its weights")
        self.model = loaded.model.eval()
        self.tokenizer = loaded.tokenizer
        self.name = name
        self.v32 = speaks_v32(self.tokenizer)
        limit = getattr(self.model.config, "max_position_embeddings", None)
        self.max_model_len = int(max_model_len or limit or 4096)
        if limit and self.max_model_len > limit:
            raise ModelLoadError(
                f"--max-model-len {self.max_model_len} exceeds the model's {limit} positions"
            )
        self.eos_ids = self._eos_ids()
        #: how a chat template's requests become prompts and its replies messages: the local agent's
        #: own TemplateFormat, so that both render and parse alike (None: V3.2 format, or no template)
        self.format: TemplateFormat | None = None
        if self.v32 and tool_call_parser not in (None, "auto"):
            raise ModelLoadError(
                f"--tool-call-parser {tool_call_parser}: {name!r} speaks the V3.2 format, whose tool calls are "
                "DSML; the parsers are for models with their own chat template"
            )
        if not self.v32 and getattr(self.tokenizer, "chat_template", None):
            try:
                self.format = TemplateFormat(self.tokenizer, self.eos_ids, tool_parser=tool_call_parser)
            except AgentError as err:
                raise ModelLoadError(str(err)) from err
        # the ids the model embeds: a tokenizer may hold more (added tokens) or fewer (padded embeddings)
        self.vocab_size = int(getattr(self.model.config, "vocab_size", None) or len(self.tokenizer))

    def _eos_ids(self) -> list[int]:
        ids: set[int] = set()
        gen = getattr(self.model, "generation_config", None)
        for source in (
            getattr(gen, "eos_token_id", None),
            getattr(self.model.config, "eos_token_id", None),
            getattr(self.tokenizer, "eos_token_id", None),
        ):
            if source is not None:
                ids.update(source if isinstance(source, list | tuple) else [source])
        return sorted(int(i) for i in ids)

    @property
    def prompt_format(self) -> str:
        """How chat requests become prompts, in words (the server's start-up line)."""
        if self.v32:
            return "V3.2 format"
        if self.format is not None:
            return f"its chat template, {self.format.tool_parser.name} tool calls"
        return "no chat template: text completions only"

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # ------------------------------------------------------------------ chat prompts
    def chat_prompt(self, req: ChatCompletionRequest) -> ChatPrompt:
        messages = [m.as_dict() for m in req.messages]
        tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
        if self.v32:
            return self._v32_prompt(req, messages, tools)
        return self._template_prompt(req, messages, tools)

    def _v32_prompt(self, req: ChatCompletionRequest, messages: list[dict], tools: list[dict]) -> ChatPrompt:
        unknown = set(req.chat_template_kwargs or {}) - {"thinking"}
        if unknown:
            raise invalid(
                f"chat_template_kwargs {sorted(unknown)} are not known to the V3.2 format (only 'thinking')",
                "chat_template_kwargs",
            )
        mode = "thinking" if req.thinking else "chat"
        choice, forced = req.tool_choice, None
        if choice == "none":
            tools = []
        elif choice == "required" or isinstance(choice, NamedToolChoice):
            opening = P.CALLS_START + "\n" + P.INVOKE_OPEN
            if isinstance(choice, NamedToolChoice):
                tools = [t for t in tools if t["function"]["name"] == choice.function.name]
                opening += choice.function.name + '">\n'
            forced = Forced(opening, P.THINK_END if mode == "thinking" else "")
        try:
            conversation = attach_tools(strip_tool_results(messages), tools, req.output_format)
        except ConversationError as err:
            raise invalid(str(err), "messages") from err
        try:
            text = encode_messages(conversation, thinking_mode=mode)
        except ConversationError as err:
            raise invalid(*_request_position(err, len(conversation) - len(messages))) from err
        return ChatPrompt(text, self.encode(text), mode, forced)

    def _template_prompt(
        self, req: ChatCompletionRequest, messages: list[dict], tools: list[dict]
    ) -> ChatPrompt:
        if self.format is None:
            raise invalid(
                f"model {self.name!r} has no chat template and does not speak the V3.2 format: use /v1/completions",
                "messages",
            )
        if req.output_format is not None:
            raise invalid("response_format needs a V3.2-format model", "response_format")
        try:  # OpenAI's rules for any format: roles, content, tool calls and the results that answer them
            check_conversation(messages, "chat")
        except ConversationError as err:
            raise invalid(str(err), "messages") from err
        for index, m in enumerate(messages):
            if m["role"] == "system" and not isinstance(m.get("content"), str):
                raise invalid(f"message {index}: a system message needs string content", "messages")
            if m["role"] == "assistant" and m["content"] is None:
                m["content"] = ""  # a tool-calling turn without text: templates concatenate content
        kwargs = dict(req.chat_template_kwargs or {})
        thinking = bool(kwargs.get("thinking", kwargs.get("enable_thinking", False)))
        choice, forced = req.tool_choice, None
        if choice == "none":
            tools = []
        elif choice == "required" or isinstance(choice, NamedToolChoice):
            if thinking:
                raise invalid(
                    "tool_choice 'required' or a named function forces the opening of a call as the reply's "
                    f"first text, and {self.name!r} with thinking on may open its reply with <think>: turn "
                    "thinking off for a forced call",
                    "tool_choice",
                )
            name = choice.function.name if isinstance(choice, NamedToolChoice) else None
            if name is not None:
                tools = [t for t in tools if t["function"]["name"] == name]
            forced = Forced(self.format.tool_parser.opening(name), "")
        try:
            prompt = self.format.prompt(messages, tools, thinking, kwargs)
        except AgentError as err:
            raise invalid(str(err), "messages") from err
        return ChatPrompt(prompt.text, prompt.ids, "thinking" if thinking else "chat", forced)

    def stream(self, prompt: ChatPrompt) -> V32Stream | TemplateStream:
        """A parser of the reply to ``prompt`` (see :mod:`~dsv32.serve.stream`)."""
        if self.v32:
            return V32Stream(prompt.thinking_mode)
        return TemplateStream(self.format, prompt.thinking_mode == "thinking")


def _request_position(err: ConversationError, inserted: int) -> tuple[str, str]:
    """``err``'s message and param, its position counted in the request's messages: ``inserted`` is how
    many messages :func:`~dsv32.chat.attach_tools` put in front of them (the system message carrying
    the tools, when the request had none)."""
    if not inserted or err.index is None:
        return str(err), "messages"
    if err.index < inserted:
        return f"tools: {err.problem}", "tools"
    return str(ConversationError(err.index - inserted, err.problem)), "messages"


def speaks_v32(tokenizer) -> bool:
    """True when ``tokenizer`` keeps every V3.2 special token whole (prompts use the V3.2 format)."""
    if isinstance(tokenizer, ByteTokenizer) or not hasattr(tokenizer, "get_added_vocab"):
        return False
    return not missing_special_tokens(tokenizer)


def load_served(
    name: str, *, device: str = "auto", max_model_len: int | None = None, tool_call_parser: str | None = None
) -> ServedModel:
    """``MODEL`` of ``dsv32 serve``: a native V3.2 checkpoint, a Hugging Face directory, ``smollm2``, a tiny
    test model, or a DSA stage output (a directory with ``dsa_config.json`` holding its base weights)."""
    from dsv32.dsa.hf.config import CONFIG_FILE

    if (Path(name) / CONFIG_FILE).is_file():
        loaded = _load_dsa_stage(name, device)
    else:
        loaded = load_model(name, device=device)
    return ServedModel(loaded, served_name(name), max_model_len, tool_call_parser)


def _load_dsa_stage(path: str, device: str) -> LoadedModel:
    from transformers import AutoTokenizer

    from dsv32.dsa.hf import load_dsa
    from dsv32.engine.models import resolve_device

    model = load_dsa(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise ModelLoadError(
            f"{path} holds no tokenizer ({err}); save one beside the DSA stage's weights"
        ) from err
    model.to(resolve_device(device))
    return LoadedModel(model, tokenizer, "hf", path)


def served_name(name: str) -> str:
    """The model id clients use: the name given, without a trailing slash."""
    return name.rstrip("/") or name
