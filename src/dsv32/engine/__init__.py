"""Local inference: prefill/decode with the sparse KV cache, batched sampling that records sampling
log-probs, kept token sets and MoE routing (what RL needs)."""

from dsv32.engine.generate import GenerationOutput, generate, pad_prompts
from dsv32.engine.sampling import SamplingParams, kept_mask, sample_next

__all__ = ["GenerationOutput", "SamplingParams", "generate", "kept_mask", "pad_prompts", "sample_next"]
