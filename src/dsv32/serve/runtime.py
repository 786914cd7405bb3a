"""The served model: weights, tokenizer, and how a chat request becomes a prompt.

A model speaks the V3.2 format when its tokenizer knows the V3.2 special tokens (a native V3.2
checkpoint with its tokenizer, or any model whose tokenizer was given them with
:func:`dsv32.chat.add_v32_special_tokens`). Its prompts are :func:`dsv32.chat.encode_messages` of the
request's messages with the tools attached (thinking mode when ``chat_template_kwargs.thinking``),
and its completions are decoded with special tokens kept, for the parser. Any other model renders
the messages with its own chat template (``tools`` and ``chat_template_kwargs`` passed through) and
its completions are plain content.

Tool results are untrusted text: before the prompt is tokenized, the special-token strings are
removed from the content of ``tool`` messages (:func:`dsv32.chat.strip_tool_results`) — the V3.2
special tokens on a V3.2 model, the tokenizer's own special tokens with a chat template — so a tool
result cannot open a turn of its own. Other messages are the caller's and go in verbatim.

``tool_choice`` on a V3.2 model: ``"none"`` leaves the tools out of the prompt; ``"required"`` and a
named function force the opening of a tool-call block (and the function's name) as the answer's
first tokens — right away in chat mode, right after ``</think>`` in thinking mode — and a named
function is the only tool shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsv32.chat import (
    ConversationError,
    attach_tools,
    encode_messages,
    missing_special_tokens,
    strip_tool_results,
    tokenizer_special_tokens,
)
from dsv32.chat import protocol as P
from dsv32.chat.validate import check_conversation
from dsv32.engine.models import ByteTokenizer, LoadedModel, ModelLoadError, load_model
from dsv32.serve.errors import invalid
from dsv32.serve.protocol import ChatCompletionRequest, NamedToolChoice


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

    def __init__(self, loaded: LoadedModel, name: str, max_model_len: int | None = None) -> None:
        if loaded.tokenizer is None:
            raise ModelLoadError(f"model {loaded.source!r} has no tokenizer: save one beside its weights")
        self.model = loaded.model.eval()
        self.tokenizer = loaded.tokenizer
        self.name = name
        self.v32 = speaks_v32(self.tokenizer)
        # what tool results lose before a chat template renders them (the V3.2 path strips its own)
        self.special_tokens = tokenizer_special_tokens(self.tokenizer)
        limit = getattr(self.model.config, "max_position_embeddings", None)
        self.max_model_len = int(max_model_len or limit or 4096)
        if limit and self.max_model_len > limit:
            raise ModelLoadError(
                f"--max-model-len {self.max_model_len} exceeds the model's {limit} positions"
            )
        self.eos_ids = self._eos_ids()
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
        if getattr(self.tokenizer, "chat_template", None):
            return "its chat template"
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
        if not getattr(self.tokenizer, "chat_template", None):
            raise invalid(
                f"model {self.name!r} has no chat template and does not speak the V3.2 format: use /v1/completions",
                "messages",
            )
        if req.tool_choice == "required" or isinstance(req.tool_choice, NamedToolChoice):
            raise invalid(
                "tool_choice 'required' or a named function needs a V3.2-format model (this model's tool calls "
                "are not parsed)",
                "tool_choice",
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
        import jinja2  # what transformers renders chat templates with

        kwargs = dict(req.chat_template_kwargs or {})
        if tools and req.tool_choice != "none":
            kwargs["tools"] = tools
        messages = strip_tool_results(messages, self.special_tokens)
        try:
            text = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False, **kwargs
            )
        except (ValueError, TypeError, KeyError, jinja2.TemplateError) as err:
            raise invalid(f"the chat template cannot render these messages: {err}", "messages") from err
        return ChatPrompt(text, self.encode(text), "chat")


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


def load_served(name: str, *, device: str = "auto", max_model_len: int | None = None) -> ServedModel:
    """``MODEL`` of ``dsv32 serve``: a native V3.2 checkpoint, a Hugging Face directory, ``smollm2``, a tiny
    test model, or a DSA stage output (a directory with ``dsa_config.json`` holding its base weights)."""
    from dsv32.dsa.hf.config import CONFIG_FILE

    if (Path(name) / CONFIG_FILE).is_file():
        loaded = _load_dsa_stage(name, device)
    else:
        loaded = load_model(name, device=device)
    return ServedModel(loaded, served_name(name), max_model_len)


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
