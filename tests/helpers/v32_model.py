"""The tiny random V3.2 model speaking the V3.2 format, for the server tests.

The tokenizer is byte-level (256 byte tokens) plus the V3.2 special tokens and the DSML tag, added
with :func:`dsv32.chat.add_v32_special_tokens`. The model is the tiny random
:class:`~dsv32.model.DeepseekV32` (real forward, real sparse KV cache) with a script: after the
prompts of :func:`scripts` it writes their completions — a thinking turn that calls two tools in one
DSML block, the answer after the tool results, a chat-mode answer, a call forced by ``tool_choice`` —
so that the server's parsing, streaming and round trip can be checked end to end. Anywhere else its
output is the random model's.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dsv32.chat import EOS, add_v32_special_tokens, encode_messages
from dsv32.chat.encode import render_tool_call

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Local time of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "hours": {"type": "integer"}},
            },
        },
    },
]
QUESTION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather and time in Paris?"},
]
CALLS = [("get_weather", {"city": "Paris"}), ("get_time", {"city": "Paris", "hours": 24})]
REASONING = "Two tools."
CALL_BLOCK = (
    "\n\n<｜DSML｜function_calls>\n"
    + "\n".join(render_tool_call(name, args) for name, args in CALLS)
    + "\n</｜DSML｜function_calls>"
)
RESULTS = ["sunny, 21 C", "14:05"]
ANSWER_REASONING = "Both known."
ANSWER = "Sunny, 21 C; it is 14:05."
CHAT_ANSWER = "Hi there."
THINKING_ANSWER = ("Greet them.", "Salut!")
FORCED_CALL = render_tool_call("get_weather", {"city": "Paris"})


def conversation_after_calls() -> list[dict]:
    """The question, the assistant's two calls and their results (what the client sends back)."""
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, (n, a) in enumerate(CALLS)
    ]
    return [
        *QUESTION,
        {"role": "assistant", "content": "", "reasoning_content": REASONING, "tool_calls": calls},
        *({"role": "tool", "tool_call_id": f"call_{i}", "content": r} for i, r in enumerate(RESULTS)),
    ]


def _with_tools(messages: list[dict]) -> list[dict]:
    return [{**messages[0], "tools": TOOLS}, *messages[1:]]


def scripts() -> list[tuple[str, str]]:
    """(prompt, completion) pairs the model learns."""
    return [
        (encode_messages(_with_tools(QUESTION), "thinking"), REASONING + "</think>" + CALL_BLOCK + EOS),
        (
            encode_messages(_with_tools(conversation_after_calls()), "thinking"),
            ANSWER_REASONING + "</think>" + ANSWER + EOS,
        ),
        (encode_messages(QUESTION, "chat"), CHAT_ANSWER + EOS),
        (encode_messages(QUESTION, "thinking"), THINKING_ANSWER[0] + "</think>" + THINKING_ANSWER[1] + EOS),
        (
            encode_messages([{**QUESTION[0], "tools": TOOLS[:1]}, QUESTION[1]], "chat"),
            "\n\n<｜DSML｜function_calls>\n" + FORCED_CALL + "\n</｜DSML｜function_calls>" + EOS,
        ),
    ]


#: Tags of the DSML format, added as ordinary tokens so that a tool-call block is short.
DSML_PIECES = [
    "\n\n<｜DSML｜function_calls>\n",
    "</｜DSML｜function_calls>",
    '<｜DSML｜invoke name="',
    "</｜DSML｜invoke>",
    '<｜DSML｜parameter name="',
    '" string="true">',
    '" string="false">',
    "</｜DSML｜parameter>",
]


def byte_tokenizer():
    """A byte-level BPE tokenizer without merges, plus the V3.2 special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core)
    add_v32_special_tokens(tokenizer)
    tokenizer.add_tokens(
        DSML_PIECES, special_tokens=True
    )  # whole tags as single tokens: completions a few dozen tokens long
    tokenizer.eos_token = EOS
    tokenizer.pad_token = EOS
    tokenizer.bos_token = "<｜begin▁of▁sentence｜>"
    return tokenizer


class ScriptedV32:
    """Mix-in for :class:`~dsv32.model.DeepseekV32`: after its own forward, the logit of the scripted
    next token is raised by ``BIAS`` wherever ``(position, token)`` is a key of ``self.script``.

    Positions are counted from the attention mask as the model counts them, so the script holds in a
    left-padded, continuously batched row and with the KV cache as it does alone.
    """

    BIAS = 1e4
    script: dict[tuple[int, int], int]

    def forward(self, input_ids, *, attention_mask=None, logits_to_keep: int = 0, **kwargs):
        out = super().forward(
            input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep, **kwargs
        )
        B, T = input_ids.shape
        if attention_mask is None:
            start = kwargs["cache"].length - T if kwargs.get("cache") is not None else 0
            positions = torch.arange(start, start + T).expand(B, T)
        else:
            positions = (attention_mask.long().cumsum(-1) - 1)[:, -T:]
        kept = out.logits.shape[1]
        for b in range(B):
            for t in range(kept):
                key = (int(positions[b, T - kept + t]), int(input_ids[b, T - kept + t]))
                if key in self.script:
                    out.logits[b, t, self.script[key]] += self.BIAS
        return out


def scripted_model(tokenizer, seed: int = 0):
    """The tiny random V3.2 model with :func:`scripts` wired in (see :class:`ScriptedV32`)."""
    from dsv32.engine.models import tiny_native_config
    from dsv32.model import DeepseekV32

    class Scripted(ScriptedV32, DeepseekV32):
        pass

    eos = tokenizer.convert_tokens_to_ids(EOS)
    torch.manual_seed(seed)
    config = tiny_native_config(
        vocab_size=len(tokenizer), eos_token_id=eos, pad_token_id=eos, bos_token_id=tokenizer.bos_token_id,
        max_position_embeddings=4096,
    )  # fmt: skip
    model = Scripted(config).eval()
    model.script = {}
    for prompt, completion in scripts():
        ids = tokenizer.encode(prompt + completion)
        for j in range(len(tokenizer.encode(prompt)) - 1, len(ids) - 1):
            if model.script.setdefault((j, ids[j]), ids[j + 1]) != ids[j + 1]:
                raise ValueError(f"two scripts disagree after position {j}; change one of them")
    return model


def save_plain(path: Path, seed: int = 0) -> Path:
    """The same tiny model without a script, as a checkpoint directory ``dsv32 serve`` loads."""
    from dsv32.model import DeepseekV32

    tokenizer = byte_tokenizer()
    scripted = scripted_model(tokenizer, seed)
    plain = DeepseekV32(scripted.config)
    plain.load_state_dict(scripted.state_dict())
    plain.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
