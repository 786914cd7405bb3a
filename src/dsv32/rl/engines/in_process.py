"""The in-process engine: :func:`dsv32.engine.generate` on the trainer's own model (the reference)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dsv32.engine import generate
from dsv32.engine.prefix import PrefixCache
from dsv32.rl.engines.base import EngineOutput, turn_generator


class InProcessEngine:
    """Samples with ``model`` itself: its weights are always the trainer's, so :meth:`sync` only
    records the version (see :class:`~dsv32.rl.engines.base.RolloutEngine` for what
    ``shares_weights`` allows)."""

    name = "in_process"
    shares_weights = True
    retried = 0  # nothing is sent anywhere

    def __init__(self, model: torch.nn.Module, version: int = 0) -> None:
        self.model = model
        self.version = version
        self.synced: int | None = None

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
        if model is not self.model:
            raise ValueError("the in-process engine samples with the trainer's model itself")
        self.version = self.synced = version
        return 0.0

    def weight_version(self) -> int:
        return self.version

    def close(self) -> None:
        pass
