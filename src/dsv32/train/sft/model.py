"""A model ready to learn the V3.2 conversation format: the special tokens in its tokenizer, rows for
them in its embeddings, the V3.2 end token among its stop tokens, and the V3.2 chat template saved
with it.

Tokenizers that lack ``<｜begin▁of▁sentence｜>``, ``<｜end▁of▁sentence｜>``, ``<｜User｜>``,
``<｜Assistant｜>``, ``<think>``, ``</think>`` and ``｜DSML｜`` get them as added special tokens
(:func:`dsv32.chat.add_v32_special_tokens`); the embedding (and untied output) matrix grows to the
tokenizer's size. New rows start at the mean of the old rows (Hugging Face's ``mean_resizing``
samples around that mean; the mean itself is deterministic and keeps the first logits of the new
tokens at the average level, so they neither dominate nor vanish).

The tiny test models (``tiny-llama``, ``tiny-native``) come with a plain byte tokenizer; they get
:func:`byte_level_tokenizer` instead, a Hugging Face tokenizer with the same ids (byte ``b`` is id
``b``, 256 the end of text) that can hold added tokens.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dsv32.chat import EOS, add_v32_special_tokens, chat_template
from dsv32.distributed import shard_model, world
from dsv32.distributed.fsdp import is_sharded, local_rows
from dsv32.engine.models import ByteTokenizer, load_model
from dsv32.errors import DSV32Error


class SFTModelError(DSV32Error, ValueError):
    """A model that cannot be fine-tuned on V3.2 conversations (no usable tokenizer, packing on a
    model that cannot take a block mask)."""


@dataclass
class SFTModel:
    model: nn.Module
    tokenizer: Any
    kind: str  # "hf" or "native"
    added_tokens: list[str]
    source: str = ""
    #: The tokenizer's size before the V3.2 tokens were added: the added tokens take the ids from here
    #: on (inside the old rows when the embedding matrix was padded past the tokenizer).
    base_vocab: int = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def pad_id(self) -> int:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        return int(pad) if pad is not None else int(self.tokenizer.convert_tokens_to_ids(EOS))


def _grow_rows(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """``weight`` with rows appended up to ``rows``, each the mean of the old rows."""
    extra = rows - weight.shape[0]
    mean = weight.detach().mean(0, keepdim=True).expand(extra, -1)
    return torch.cat([weight.detach(), mean.to(weight.dtype)], 0)


def resize_native(model: nn.Module, vocab: int) -> None:
    """Grow a native V3.2 model's embedding and LM head to ``vocab`` rows (tied weights stay tied)."""
    old = model.config.vocab_size
    if vocab <= old:
        return
    embed = model.model.embed_tokens
    new_embed = nn.Embedding(vocab, embed.embedding_dim, device=embed.weight.device, dtype=embed.weight.dtype)
    new_embed.weight.data.copy_(_grow_rows(embed.weight, vocab))
    model.model.embed_tokens = new_embed
    if model.config.tie_word_embeddings:
        model.lm_head.weight = new_embed.weight
    else:
        head = model.lm_head
        new_head = nn.Linear(
            head.in_features, vocab, bias=False, device=head.weight.device, dtype=head.weight.dtype
        )
        new_head.weight.data.copy_(_grow_rows(head.weight, vocab))
        model.lm_head = new_head
    model.config.vocab_size = vocab


def resize_hf(model: nn.Module, vocab: int) -> None:
    """Grow a Hugging Face model's input (and untied output) embeddings to ``vocab`` rows, new rows at
    the mean of the old ones."""
    embed = model.get_input_embeddings()
    old = embed.weight.shape[0]
    if vocab <= old:
        return
    model.resize_token_embeddings(vocab, mean_resizing=False)
    with torch.no_grad():
        grown = model.get_input_embeddings().weight
        grown[old:] = grown[:old].mean(0, keepdim=True)
        out = model.get_output_embeddings()
        if out is not None and out.weight.data_ptr() != grown.data_ptr():
            out.weight[old:] = out.weight[:old].mean(0, keepdim=True)


def add_stop_token(model: nn.Module, tokenizer: Any) -> int:
    """Make the V3.2 end token a stop token of the model's generation config; returns its id."""
    eos = int(tokenizer.convert_tokens_to_ids(EOS))
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        current = gen.eos_token_id
        ids = [] if current is None else list(current) if isinstance(current, list | tuple) else [current]
        if eos not in ids:
            gen.eos_token_id = [*ids, eos]
    return eos


def _byte_chars() -> dict[int, str]:
    """Byte → the printable character byte-level BPE writes for it: printable Latin-1 bytes stand for
    themselves, the others (controls, space, soft hyphen) for characters from U+0100 on, in order."""
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    out, shifted = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + shifted)
            shifted += 1
    return out


def byte_level_tokenizer() -> Any:
    """A Hugging Face fast tokenizer over UTF-8 bytes: ids 0..255 are the bytes (no merges), 256 is
    ``<|endoftext|>`` (end and padding) — the ids of :class:`~dsv32.engine.models.ByteTokenizer`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = _byte_chars()
    core = Tokenizer(models.BPE(vocab={chars[b]: b for b in range(256)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=core)
    tok.add_special_tokens({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"})
    return tok


def prepare_sft_model(name: str, device: str = "auto") -> SFTModel:
    """Load ``name`` (:func:`dsv32.engine.models.load_model`) and give it the V3.2 tokens."""
    loaded = load_model(name, device=device)
    tok = loaded.tokenizer
    if isinstance(tok, ByteTokenizer):
        tok = byte_level_tokenizer()
    if tok is None or not hasattr(tok, "get_added_vocab"):
        raise SFTModelError(
            f"model {name!r} has no Hugging Face tokenizer to add the V3.2 special tokens to; save one beside "
            "its weights (a model directory with tokenizer.json)"
        )
    base_vocab = len(tok)
    added = add_v32_special_tokens(tok)
    torch.manual_seed(0)
    if loaded.kind == "native":
        resize_native(loaded.model, len(tok))
    else:
        resize_hf(loaded.model, len(tok))
    add_stop_token(loaded.model, tok)
    return SFTModel(loaded.model, tok, loaded.kind, added, name, base_vocab)


#: Attention implementations for which transformers builds a packed row's block-diagonal causal mask
#: (and any sliding window) from position ids that restart at 0; flash attention reads packed
#: sequences from position ids only for a batch of one row, so it is not among them.
PACKING_ATTENTION = ("eager", "sdpa", "flex_attention")


def check_packing(sm: SFTModel) -> None:
    """Refuse packing where a packed row would not compute what its conversations compute alone."""
    if sm.kind == "native":
        raise SFTModelError("packing needs a Hugging Face model (a block mask); set data.packing=false")
    impl = getattr(sm.model.config, "_attn_implementation", None)
    if impl not in PACKING_ATTENTION:
        raise SFTModelError(
            f"packing is exact only with attention {list(PACKING_ATTENTION)}; the model uses {impl!r}: "
            "load it with attn_implementation='sdpa' or 'eager', or set data.packing=false"
        )


def input_embeddings(model: nn.Module) -> torch.Tensor:
    """The input embedding matrix (shared with the head when tied), HF or native."""
    if hasattr(model, "get_input_embeddings"):
        return model.get_input_embeddings().weight
    return model.model.embed_tokens.weight


def vocab_matrices(model: nn.Module) -> list[torch.Tensor]:
    """The parameters with one row per token: the input embedding and, when it is not tied to it,
    the output head's weight (and bias), HF or native."""
    embed = input_embeddings(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else model.lm_head
    out = [embed]
    if head is not None:
        out += [p for p in (head.weight, getattr(head, "bias", None)) if p is not None and p is not embed]
    return out


def keep_pretrained_rows(model: nn.Module, base_vocab: int) -> None:
    """Zero the accumulated gradient of the rows below ``base_vocab`` (the pretrained tokens) of the
    embedding and of an untied head, between the backward passes and the optimizer step: with their
    own optimizer group (no weight decay) only the new tokens' rows move. Nothing stays attached to
    the model, so a later stage (GRPO) trains every row."""
    for p in vocab_matrices(model):
        if p.grad is not None:
            rows, first = local_rows(p.grad)  # a sharded gradient: this rank's rows
            rows[: max(0, base_vocab - first)] = 0


def freeze_lower_layers(model: nn.Module, n: int) -> int:
    """Keep the weights of the lowest ``n`` transformer layers fixed (``requires_grad`` False): the
    backward pass then stops above them, which roughly halves the cost of a step on a CPU when half
    the layers are frozen. Embeddings, norms, the upper layers and the head still train (tied input
    embeddings learn through the head). Returns how many layers were frozen."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = decoder.layers
    if not 0 <= n <= len(layers):
        raise SFTModelError(f"freeze_layers = {n}: the model has {len(layers)} layers")
    for layer in list(layers)[:n]:
        layer.requires_grad_(False)
    return n


def kept_logits(
    model: nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor | None,
    positions: torch.Tensor,
    keep: torch.Tensor,
) -> torch.Tensor:
    """An HF model's logits at the ``keep`` positions only (the head never sees the others)."""
    hidden = model.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
    return model.get_output_embeddings()(hidden.last_hidden_state[keep])


def shard_sft_model(sm: SFTModel) -> None:
    """FSDP2 over the ranks of a ``torchrun`` launch (:mod:`dsv32.distributed`); a no-op in one process.
    An HF model's loss runs through :func:`kept_logits`, bound to the model so that FSDP gathers the
    embedding, final norm and head around it as around a forward."""
    if not world().active or is_sharded(sm.model):
        return
    if sm.kind != "native":
        sm.model.kept_logits = types.MethodType(kept_logits, sm.model)
    shard_model(sm.model, root_methods=() if sm.kind == "native" else ("kept_logits",))


def save_sft_model(sm: SFTModel, path: str | Path) -> Path:
    """Weights + tokenizer (with the V3.2 chat template) in a directory :func:`load_model` reads."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    sm.model.save_pretrained(path)
    sm.tokenizer.chat_template = chat_template()
    sm.tokenizer.save_pretrained(path)
    return path
