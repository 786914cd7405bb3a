"""Keep Sampling Mask under a grammar: a constrained step is a truncation like top-p, so the kept set
recorded is the allowed tokens ∩ the top-p set, and the trainer's renormalization over it gives the
sampling log-probs back — the on-policy ratio stays 1."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("llguidance")
pytest.importorskip("transformers")

from dsv32.engine import generate
from dsv32.engine.constraint import Grammar, json_rule, vocabulary
from dsv32.rl.grpo.policy import load_policy

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 999}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}
TEMPERATURE = 0.8


@pytest.mark.parametrize(("top_p", "top_k"), [(1.0, 0), (0.9, 0), (0.95, 30)])
def test_the_on_policy_ratio_is_one_under_a_constraint(top_p, top_k):
    policy = load_policy("tiny-llama", device="cpu")
    tokenizer = policy.tokenizer
    voc = vocabulary(tokenizer, policy.model.config.vocab_size, policy.eos_token_id)
    grammar = Grammar("start: " + json_rule(SCHEMA), voc)
    prompts = [policy.encode(p) for p in ("2+2=", "The answer as JSON: ", "?")] * 2
    out = generate(
        policy.model, prompts, 40, TEMPERATURE, top_p, top_k, eos_token_id=policy.eos_token_id,
        pad_token_id=policy.pad_token_id, generator=torch.Generator().manual_seed(0), return_kept=True,
        constraints=[grammar.constraint() for _ in prompts],
    )  # fmt: skip
    start = out.sequences.shape[1] - out.tokens.shape[1]
    actions = torch.arange(out.tokens.shape[1])[None] < out.lengths[:, None]
    kept = out.kept_token_ids
    constrained = (kept >= 0).sum(-1) < policy.model.config.vocab_size
    assert bool(constrained[actions].all()), "every step's kept set is inside the allowed tokens"
    assert bool(((kept >= 0).sum(-1) == 1)[actions].any()), "steps the grammar forces keep one token"
    with torch.no_grad():
        logp = policy.action_logprobs(
            out.sequences, out.attention_mask, start, kept_ids=kept, temperature=TEMPERATURE
        )
        free = policy.action_logprobs(out.sequences, out.attention_mask, start, temperature=TEMPERATURE)
    log_ratio = (logp - out.logprobs)[actions]
    assert log_ratio.abs().max() <= 1e-5
    # without the kept sets the ratio is off by the mass the grammar (and top-p) cut away
    assert (free - out.logprobs)[actions].min() < -1e-2
