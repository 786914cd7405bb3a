"""Local inference over a V3.2 model (sparse KV cache) or a Hugging Face causal LM: batched sampling
that records sampling log-probs, kept token sets (Keep Sampling Mask) and MoE routing (Keep Routing)."""

from dsv32.engine.generate import GenerationOutput, generate, pad_prompts
from dsv32.engine.sampling import SamplingParams, kept_logprobs, kept_mask, sample_next, truncate

__all__ = [
    "GenerationOutput",
    "SamplingParams",
    "generate",
    "kept_logprobs",
    "kept_mask",
    "pad_prompts",
    "sample_next",
    "truncate",
]
