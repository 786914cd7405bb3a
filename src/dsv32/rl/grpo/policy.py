"""The policy the RL loop trains: a model, its tokenizer, how prompts are rendered for it, and the
training-side log-probabilities of what it sampled.

Two kinds of model, one interface:

- **Hugging Face** causal LMs (Llama / Qwen / Mistral; SmolLM2-135M-Instruct is the small real one).
  Prompts go through the tokenizer's own chat template.
- the **native** :class:`dsv32.model.DeepseekV32`. Prompts are the V3.2 conversation format
  (:func:`dsv32.chat.encode_messages`, thinking or chat mode) when the tokenizer knows the V3.2
  special tokens, plain text otherwise. Its MoE routing can be recorded and replayed (Keep Routing).

:meth:`Policy.action_logprobs` is the training forward: log π_θ of the sampled tokens, renormalized
over the recorded kept sets (Keep Sampling Mask) at the sampling temperature, with the recorded
expert routing forced (Keep Routing) — so π_θ and π_old share one action space and one parameter
subspace (paper §3.1).
"""

from __future__ import annotations

import dataclasses
import logging
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from dsv32.engine.dtype import autocast, mixed_precision, sampling_copy
from dsv32.engine.models import ByteTokenizer, ModelLoadError, load_model
from dsv32.rl.grpo.loss import token_logprobs
from dsv32.rl.grpo.tasks import Task

logger = logging.getLogger(__name__)


@dataclass
class Policy:
    """``kind``: ``"hf"`` or ``"native"``; ``thinking``: for V3.2-format prompts, thinking mode;
    ``base_only``: the training forward runs with the model's LoRA adapter switched off (the base
    model: GRPO's reference when the policy trains an adapter, :func:`dsv32.engine.lora.adapter_disabled`);
    ``autocast``: the dtype the training forward computes in under ``torch.autocast`` (bf16 mixed
    precision: matmuls in bf16 with fp32 accumulation, the weights, their gradients and the optimizer
    state fp32, log-probs from fp32 logits; :func:`with_precision`); None: the weights' own dtype."""

    model: nn.Module
    tokenizer: object
    kind: str
    thinking: bool = False
    source: str = ""
    base_only: bool = False
    autocast: torch.dtype | None = None

    # ------------------------------------------------------------------ prompts
    @property
    def speaks_v32(self) -> bool:
        """True when prompts use the V3.2 conversation format (native model + V3.2 tokenizer)."""
        if self.kind != "native" or isinstance(self.tokenizer, ByteTokenizer):
            return False
        from dsv32.chat import missing_special_tokens

        return not missing_special_tokens(self.tokenizer)

    def messages(self, task: Task) -> list[dict]:
        msgs = [{"role": "system", "content": task.system}] if task.system else []
        return [*msgs, {"role": "user", "content": task.prompt}]

    def render(self, task: Task) -> str:
        """The prompt text the model continues."""
        if self.speaks_v32:
            from dsv32.chat import encode_messages

            mode = "thinking" if self.thinking else "chat"
            return encode_messages(self.messages(task), thinking_mode=mode, add_bos=True)
        template = getattr(self.tokenizer, "chat_template", None)
        if template:
            return self.tokenizer.apply_chat_template(
                self.messages(task), add_generation_prompt=True, tokenize=False
            )
        system = f"{task.system}\n" if task.system else ""
        return f"{system}{task.prompt}\n"

    def prompt_ids(self, task: Task) -> list[int]:
        return list(self.tokenizer.encode(self.render(task), add_special_tokens=False))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    @property
    def eos_token_id(self) -> list[int]:
        ids = []
        gen = getattr(self.model, "generation_config", None)
        for source in (getattr(gen, "eos_token_id", None), getattr(self.tokenizer, "eos_token_id", None)):
            if source is None:
                continue
            ids += list(source) if isinstance(source, (list, tuple)) else [source]
        return sorted(set(ids))

    @property
    def pad_token_id(self) -> int:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        return int(pad if pad is not None else self.eos_token_id[0])

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def precision(self):
        """The context the training forwards run in: ``torch.autocast`` to :attr:`autocast`, or none."""
        return autocast(self.device, self.autocast)

    # ------------------------------------------------------------------ training forward
    def action_logprobs(
        self,
        sequences: torch.Tensor,
        attention_mask: torch.Tensor,
        start: int,
        *,
        kept_ids: torch.Tensor | None = None,
        routing: torch.Tensor | None = None,
        temperature: float = 1.0,
        action_mask: torch.Tensor | None = None,
        trunk: tuple[torch.Tensor, int] | None = None,
        indexing: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """log π_θ of ``sequences[:, start:]`` given everything before, ``[B, L - start]``.

        ``sequences``/``attention_mask`` ``[B, L]`` (left-padded prompts, then actions);
        ``kept_ids`` ``[B, L - start, K]`` (−1 padded) renormalizes over the kept sets;
        ``routing`` ``[num_moe_layers, B, L - 1, k]`` forces the experts (native model only);
        ``indexing`` ``[DSA layers, B, L - 1, index_topk]`` forces the indexer's selections (row
        positions, :mod:`dsv32.dsa.keep`; a model with DSA in sparse mode);
        ``action_mask`` ``[B, L - start]``: only these positions go through the LM head (the
        log-probs elsewhere are 0) — in a multi-turn row the tool results and the text that reopens
        each turn sit between the actions, and the head (a ``[V, D]`` matmul per position, its
        backward and a softmax over ``V``) is a large part of a small model's training step.
        Without it the last ``L - start`` positions go through the head. Only the columns some row
        of this batch uses go through the model: leading columns that are padding in every row and
        trailing ones past the longest row are cut (their log-probs are 0; positions are counted
        from the mask, so no row's values change).

        ``trunk``: ``(states, depth)``, the rows' hidden states after the lowest ``depth`` layers
        (:meth:`trunk_states`, ``[B, L - 1, D]``): the forward starts there and runs only the layers
        above (HF models).
        """
        if self.base_only:
            from dsv32.engine.lora import adapter_disabled

            with adapter_disabled(self.model):
                return dataclasses.replace(self, base_only=False).action_logprobs(
                    sequences,
                    attention_mask,
                    start,
                    kept_ids=kept_ids,
                    routing=routing,
                    temperature=temperature,
                    action_mask=action_mask,
                    trunk=trunk,
                    indexing=indexing,
                )
        L = sequences.shape[1]
        lead, end = _used_columns(attention_mask, start)
        sequences, attention_mask = sequences[:, lead:end], attention_mask[:, lead:end]
        kept_ids = None if kept_ids is None else kept_ids[:, : end - start]
        select = None if action_mask is None else action_mask[:, : end - start].bool()
        routing = None if routing is None else routing[:, :, lead : end - 1]
        indexing = None if indexing is None else indexing[:, :, lead : end - 1]  # row positions: unchanged
        start -= lead
        ids = sequences[:, :-1]
        mask = attention_mask[:, :-1]
        T = sequences.shape[1] - start
        if self.kind != "native" and routing is not None:
            raise ValueError("Keep Routing needs the native MoE model; this policy is a dense HF model")
        if trunk is not None and self.kind == "native":
            raise ValueError("a trunk forward needs a Hugging Face model; this policy is the native one")
        if self.kind == "native":
            with _head_at(self.model, select), self.precision():
                out = self.model(
                    ids, attention_mask=mask, routing=routing, indexing=indexing, logits_to_keep=T
                )
        else:
            positions = (mask.long().cumsum(-1) - 1).clamp_min(0)
            inputs = {"input_ids": ids}
            depth = 0
            if trunk is not None:
                states, depth = trunk
                inputs = {"inputs_embeds": states[:, lead : end - 1]}
            with (
                _head_at(self.model, select),
                _only_layers(self.model, depth, None),
                _forcing(self.model, indexing),
                self.precision(),
            ):
                out = self.model(
                    **inputs, attention_mask=mask, position_ids=positions, logits_to_keep=T, use_cache=False
                )
        targets = sequences[:, start:]
        if select is None:
            logp = token_logprobs(out.logits, targets, kept_ids, temperature)
        else:  # out.logits [N, V]: the selected positions, row by row
            kept = None if kept_ids is None else kept_ids[select][None]
            picked = token_logprobs(out.logits[None], targets[select][None], kept, temperature)[0]
            logp = picked.new_zeros(select.shape).index_put((select,), picked)
        return torch.nn.functional.pad(logp, (0, L - end))  # 0 past the longest row

    # ------------------------------------------------------------------ frozen trunk
    def frozen_trunk(self) -> int:
        """How many of the lowest decoder layers keep their weights, with the input embeddings (no
        parameter of theirs requires a gradient): a row's hidden states after them do not change
        while the policy trains, so one forward of those layers (:meth:`trunk_states`) can serve
        every training forward of a rollout batch. 0 when the embeddings train, and for the native
        model."""
        layers = _decoder_layers(self.model) if self.kind != "native" else None
        if layers is None or any(p.requires_grad for p in self.model.get_input_embeddings().parameters()):
            return 0
        depth = 0
        for layer in layers:
            if any(p.requires_grad for p in layer.parameters()):
                break
            depth += 1
        return depth

    def shares_trunk(self, other: Policy, depth: int) -> bool:
        """True when ``other``'s input embeddings and lowest ``depth`` layers hold exactly this
        policy's weights (a reference copied from it while they were frozen), so its forward can
        start from this policy's :meth:`trunk_states`."""
        if self.kind == "native" or other.kind == "native" or depth == 0:
            return False
        mine, theirs = _decoder_layers(self.model), _decoder_layers(other.model)
        if mine is None or theirs is None or len(theirs) < depth:
            return False
        pairs = [(self.model.get_input_embeddings(), other.model.get_input_embeddings())]
        pairs += list(zip(list(mine)[:depth], list(theirs)[:depth]))
        return all(_same_weights(a, b) for a, b in pairs)

    @torch.no_grad()
    def trunk_states(self, sequences: torch.Tensor, attention_mask: torch.Tensor, start: int, depth: int):
        """The hidden states after the embeddings and the lowest ``depth`` layers at every input
        column, ``[B, L - 1, D]`` (inputs ``sequences[:, :-1]``, laid out as in
        :meth:`action_logprobs`): what a forward with ``trunk=(states, depth)`` starts from. Columns
        that are padding in every row are zero (masked out of attention like any padding)."""
        if self.kind == "native":
            raise ValueError("trunk states need a Hugging Face model; this policy is the native one")
        B, L = sequences.shape
        lead, end = _used_columns(attention_mask, start)
        ids, mask = sequences[:, lead : end - 1], attention_mask[:, lead : end - 1]
        positions = (mask.long().cumsum(-1) - 1).clamp_min(0)
        decoder = self.model.get_decoder()
        captured = []
        hook = decoder.norm.register_forward_pre_hook(lambda _module, args: captured.append(args[0]))
        try:
            with _only_layers(self.model, 0, depth), self.precision():
                decoder(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
        finally:
            hook.remove()
        states = captured[0].new_zeros(B, L - 1, captured[0].shape[-1])
        states[:, lead : end - 1] = captured[0]
        return states


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    pa, pb = list(a.parameters()), list(b.parameters())
    return len(pa) == len(pb) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(pa, pb))


def _decoder_layers(model: nn.Module) -> nn.ModuleList | None:
    """An HF causal LM's decoder layers (``get_decoder().layers``), None for another layout."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    return layers if isinstance(layers, nn.ModuleList) and hasattr(decoder, "norm") else None


@contextmanager
def _only_layers(model: nn.Module, first: int, stop: int | None):
    """Within the block, ``model``'s decoder runs only its layers ``[first, stop)`` (the same modules):
    a forward from the trunk's states (``first`` = depth) or of the trunk alone (``stop`` = depth).
    HF decoders loop over their ``layers`` list; each layer keeps its own index and attention type."""
    if first == 0 and stop is None:
        yield
        return
    decoder = model.get_decoder()
    every = decoder.layers
    decoder.layers = nn.ModuleList(list(every)[first:stop])
    try:
        yield
    finally:
        decoder.layers = every


@contextmanager
def _forcing(model: nn.Module, indexing: torch.Tensor | None):
    """Within the block, the DSA layers of an HF ``model`` attend to ``indexing`` (Keep Indexing)."""
    if indexing is None:
        yield
        return
    from dsv32.dsa.hf import get_dsa

    with get_dsa(model).indexing(forced=indexing):
        yield


@contextmanager
def _head_at(model: nn.Module, select: torch.Tensor | None):
    """Within the block, ``model``'s output head computes logits only at ``select`` ``[B, T]`` of the
    hidden states ``[B, T, D]`` it is handed, returning ``[N, V]`` (None: every position). A hook on
    the head module, so the model's own forward (masks, positions, an FSDP root's gathering of the
    head) runs unchanged; HF models and the native one both hand the head ``[B, T, D]``."""
    if select is None:
        yield
        return
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else model.lm_head
    handle = head.register_forward_pre_hook(lambda _module, args: (args[0][select], *args[1:]))
    try:
        yield
    finally:
        handle.remove()


def _used_columns(attention_mask: torch.Tensor, start: int) -> tuple[int, int]:
    """``(lead, end)``: columns ``[lead, end)`` hold every real token of the batch; ``lead <= start``
    and ``end > start`` (at least one action column)."""
    used = attention_mask.bool().any(0)
    if not bool(used.any()):
        return 0, attention_mask.shape[1]
    first = int(used.int().argmax())
    last = attention_mask.shape[1] - int(used.flip(0).int().argmax())
    return min(first, start), max(last, start + 1)


def with_precision(policy: Policy, dtype: str) -> Policy:
    """``policy`` whose training forwards compute in ``dtype`` (``"float32"``, ``"bfloat16"`` or
    ``"auto"``: bf16 where the device has native bf16; :func:`dsv32.engine.dtype.mixed_precision`).
    The model is shared, not copied."""
    return dataclasses.replace(policy, autocast=mixed_precision(policy.model, dtype))


def sampling_policy(policy: Policy, dtype: str) -> Policy:
    """``policy`` sampling in ``dtype`` (``[engine] dtype``): itself when its weights are in that
    dtype, else the same policy on a copy of its model cast to it, holding the weights of the moment
    (:func:`dsv32.engine.dtype.sampling_copy`) — what an evaluation outside the trainer samples with,
    as the rollouts do."""
    model = sampling_copy(policy.model, dtype)
    return policy if model is policy.model else dataclasses.replace(policy, model=model)


def load_policy(name: str, *, thinking: bool = False, device: str = "auto") -> Policy:
    """``"smollm2"`` (SmolLM2-135M-Instruct, offline), ``"tiny-llama"`` / ``"tiny-native"`` (tiny random
    models with a byte tokenizer, for tests), an HF model directory, or a native V3.2 checkpoint
    (see :func:`dsv32.engine.models.load_model`)."""
    loaded = load_model(name, device=device)
    if loaded.tokenizer is None:
        raise ModelLoadError(f"policy {name!r} has no tokenizer: save one beside its weights")
    return Policy(loaded.model, loaded.tokenizer, loaded.kind, thinking=thinking, source=name)
