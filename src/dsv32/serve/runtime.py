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

``tool_choice``: ``"none"`` leaves the tools out of the prompt; ``"required"`` and a named function
constrain the reply (:mod:`dsv32.agent.backends.grammars`, :mod:`dsv32.engine.constraint`) to calls
of the offered tools — one named call, or one or more calls (one with ``parallel_tool_calls: false``)
— with arguments valid under their schemas, written as the model's format writes them: a DSML block
on a V3.2 model (right away in chat mode, after free reasoning and ``</think>`` in thinking mode),
the tool-call parser's calls on a chat-template model (with thinking on they are refused: the reply
may open with ``<think>``). A named function is the only tool shown. ``response_format``
``json_object`` / ``json_schema`` constrains the answer to JSON (under the schema) the same way. A
grammar the library cannot compile (an unsupported schema keyword) is a 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsv32.agent.backends import grammars
from dsv32.agent.backends.formats import TemplateFormat
from dsv32.agent.errors import AgentError
from dsv32.chat import (
    ConversationError,
    attach_tools,
    encode_messages,
    missing_special_tokens,
    strip_tool_results,
)
from dsv32.chat.validate import check_conversation
from dsv32.engine.constraint import Grammar, GrammarError, Vocabulary, vocabulary
from dsv32.engine.models import ByteTokenizer, LoadedModel, ModelLoadError, load_model
from dsv32.serve.errors import invalid
from dsv32.serve.protocol import ChatCompletionRequest, NamedToolChoice
from dsv32.serve.stream import V32Stream
from dsv32.serve.template_stream import TemplateStream


@dataclass(frozen=True)
class ChatPrompt:
    text: str
    ids: list[int]
    thinking_mode: str  # "thinking" / "chat" for V3.2 models
    grammar: Grammar | None = None  # what the reply must be (tool_choice, response_format)


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

    @property
    def dtype(self) -> str:
        """The dtype the model computes in (``float32``, ``bfloat16``)."""
        from dsv32.engine.dtype import dtype_name, model_dtype

        return dtype_name(model_dtype(self.model))

    @property
    def vocabulary(self) -> Vocabulary:
        """The tokens as constrained decoding sees them (built on first use, about a second)."""
        markup = grammars.V32_MARKUP if self.v32 else grammars.TEMPLATE_MARKUP
        return vocabulary(self.tokenizer, self.vocab_size, self.eos_ids, markup)

    def grammar(self, body, reasoning: bool, param: str) -> Grammar:
        """The compiled grammar of a reply (see :func:`dsv32.agent.backends.grammars.reply`); a 400 naming
        ``param`` when the library cannot compile it."""
        try:
            return Grammar(grammars.reply(body, reasoning=reasoning), self.vocabulary)
        except GrammarError as err:
            raise invalid(f"{param}: {err}", param) from err

    def reply_grammar(self, req: ChatCompletionRequest, tools: list[dict], reasoning: bool) -> Grammar | None:
        """The grammar ``tool_choice`` (``required``, a named function) or else ``response_format``
        puts on the reply; None when neither does (``tool_choice`` ``auto``/``none``, plain text)."""
        choice = req.tool_choice
        if choice == "required" or isinstance(choice, NamedToolChoice):
            many = choice == "required" and req.parallel_tool_calls is not False
            if self.v32:
                return self.grammar(lambda rules: grammars.dsml_calls(rules, tools, many), reasoning, "tools")
            parser = self.format.tool_parser
            return self.grammar(
                lambda rules: grammars.template_calls(rules, parser, tools, many), reasoning, "tools"
            )
        schema = req.output_schema
        if schema is None:
            return None
        return self.grammar(lambda rules: grammars.json_reply(rules, schema), reasoning, "response_format")

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
        choice = req.tool_choice
        if choice == "none":
            tools = []
        elif isinstance(choice, NamedToolChoice):
            tools = [t for t in tools if t["function"]["name"] == choice.function.name]
        grammar = self.reply_grammar(req, tools, reasoning=mode == "thinking")
        try:
            conversation = attach_tools(strip_tool_results(messages), tools, req.output_format)
        except ConversationError as err:
            raise invalid(str(err), "messages") from err
        try:
            text = encode_messages(conversation, thinking_mode=mode)
        except ConversationError as err:
            raise invalid(*_request_position(err, len(conversation) - len(messages))) from err
        return ChatPrompt(text, self.encode(text), mode, grammar)

    def _template_prompt(
        self, req: ChatCompletionRequest, messages: list[dict], tools: list[dict]
    ) -> ChatPrompt:
        if self.format is None:
            raise invalid(
                f"model {self.name!r} has no chat template and does not speak the V3.2 format: use /v1/completions",
                "messages",
            )
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
        choice = req.tool_choice
        if choice == "none":
            tools = []
        elif choice == "required" or isinstance(choice, NamedToolChoice):
            if thinking:
                raise invalid(
                    "tool_choice 'required' or a named function makes a call the reply's first text, and "
                    f"{self.name!r} with thinking on may open its reply with <think>: turn thinking off for "
                    "a forced call",
                    "tool_choice",
                )
            if isinstance(choice, NamedToolChoice):
                tools = [t for t in tools if t["function"]["name"] == choice.function.name]
        elif req.output_schema is not None and thinking:
            raise invalid(
                f"response_format makes JSON the reply's first text, and {self.name!r} with thinking on may "
                "open its reply with <think>: turn thinking off for a JSON reply",
                "response_format",
            )
        grammar = self.reply_grammar(req, tools, reasoning=False)
        try:
            prompt = self.format.prompt(messages, tools, thinking, kwargs)
        except AgentError as err:
            raise invalid(str(err), "messages") from err
        return ChatPrompt(prompt.text, prompt.ids, "thinking" if thinking else "chat", grammar)

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
    name: str,
    *,
    device: str = "auto",
    max_model_len: int | None = None,
    tool_call_parser: str | None = None,
    dtype: str = "float32",
) -> ServedModel:
    """``MODEL`` of ``dsv32 serve``: a native V3.2 checkpoint, a Hugging Face directory, ``smollm2``, a tiny
    test model, or a DSA stage output (a directory with ``dsa_config.json`` holding its base weights),
    in ``dtype`` (``float32``, ``bfloat16``, or ``auto``: :func:`dsv32.engine.dtype.resolve_dtype`)."""
    from dsv32.dsa.hf.config import CONFIG_FILE

    if (Path(name) / CONFIG_FILE).is_file():
        loaded = _load_dsa_stage(name, device, dtype)
    else:
        loaded = load_model(name, device=device, dtype=dtype)
    return ServedModel(loaded, served_name(name), max_model_len, tool_call_parser)


def _load_dsa_stage(path: str, device: str, dtype: str) -> LoadedModel:
    from transformers import AutoTokenizer

    from dsv32.dsa.hf import load_dsa
    from dsv32.engine.dtype import cast_model, resolve_dtype
    from dsv32.engine.models import resolve_device

    model = cast_model(load_dsa(path), resolve_dtype(dtype, resolve_device(device)))
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
