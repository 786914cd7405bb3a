"""The in-process engine: :func:`dsv32.engine.generate` on the trainer's own model (the reference),
or on a copy of it in another dtype (``[engine] dtype``: bf16 sampling beside an fp32 trainer)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from dsv32.engine import generate
from dsv32.engine.dtype import copy_weights, model_dtype, sampling_copy
from dsv32.engine.prefix import PrefixCache
from dsv32.rl.engines.base import EngineOutput, turn_generator


class InProcessEngine:
    """Samples in the trainer's process with the trainer's current weights (see
    :class:`~dsv32.rl.engines.base.RolloutEngine` for what ``shares_weights`` allows).

    ``dtype`` None (or the model's own): it samples with ``model`` itself, and :meth:`sync` only
    records the version. Another dtype (``"bfloat16"``, ``"auto"``: :func:`dsv32.engine.dtype.resolve_dtype`):
    it holds a copy of ``model`` in that dtype, and :meth:`sync` copies the trainer's weights into it,
    cast (every rollout batch starts from the weights being trained). The sampling log-probs and
    kept sets are computed in fp32 from the copy's logits; the trainer's first, on-policy update then
    shows the two dtypes' difference in its log ratio (docs/rl.md, "bf16 rollouts")."""

    name = "in_process"
    shares_weights = True
    retried = 0  # nothing is sent anywhere

    def __init__(
        self, model: torch.nn.Module, version: int = 0, dtype: str | torch.dtype | None = None
    ) -> None:
        self.source = model
        self.model = model if dtype is None else sampling_copy(model, dtype)
        self.version = version
        self.synced: int | None = None
        self.sync_s = 0.0  # seconds the last sync spent copying weights (0 without a copy)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the engine samples in."""
        return model_dtype(self.model)

    def connect(self) -> None:
        pass

    def generate(
        self,
        prompts: Sequence[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        top_k: int,
        eos: list[int],
        pad: int,
        generator: torch.Generator | Sequence[torch.Generator] | None,
        turn: int,
        return_kept: bool,
        return_routing: bool,
        prefix: PrefixCache | None = None,
        return_indexing: bool = False,
    ) -> EngineOutput:
        """:func:`dsv32.engine.generate` over the batch; ``prefix``: a
        :class:`~dsv32.engine.prefix.PrefixCache` the calls of one batch of episodes share."""
        out = generate(
            self.model,
            list(prompts),
            max_new_tokens=max_new_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
            generator=turn_generator(generator, turn),
            return_routing=return_routing,
            return_kept=return_kept,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            prefix=prefix,
            return_indexing=return_indexing,
        )
        # one copy from the device for the whole batch, not one per row
        lengths, tokens, logps = out.lengths.tolist(), out.tokens.tolist(), out.logprobs.tolist()
        return EngineOutput(
            tokens=[t[:n] for t, n in zip(tokens, lengths)],
            logprobs=[lp[:n] for lp, n in zip(logps, lengths)],
            kept=[out.kept_token_ids[j, :n] for j, n in enumerate(lengths)] if return_kept else None,
            routing=out.routing,
            weight_version=self.version,
            indexing=out.indexing,
        )

    def sync(self, model: torch.nn.Module, version: int) -> float:
        if model is not self.source:
            raise ValueError("the in-process engine samples with the trainer's model (or its copy) only")
        if self.model is not self.source:
            start = time.perf_counter()
            copy_weights(self.model, self.source)
            self.sync_s = time.perf_counter() - start
        self.version = self.synced = version
        return self.sync_s

    def weight_version(self) -> int:
        return self.version

    def close(self) -> None:
        pass
