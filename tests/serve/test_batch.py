"""Continuous batching (dsv32.engine.batch): rows that join and leave a running batch decode exactly the
tokens they decode alone (greedy), on the native V3.2 cache and on transformers' DynamicCache."""

from __future__ import annotations

import pytest
import torch

from dsv32.engine import generate
from dsv32.engine.batch import BatchError, RunningBatch, sample_rows
from dsv32.engine.models import load_model
from dsv32.engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def _alone(model, prompt: list[int], n: int) -> list[int]:
    out = generate(model, [prompt], max_new_tokens=n, temperature=0.0, eos_token_id=[])
    return out.tokens[0].tolist()


@pytest.mark.parametrize("name", ["tiny-native", "tiny-llama"])
def test_rows_joining_and_leaving_decode_as_alone(name):
    model = load_model(name, device="cpu").model
    prompts = {"a": [5, 6, 7, 8, 9, 10], "b": list(range(20, 40)), "c": [70, 71, 72]}
    expected = {key: _alone(model, p, 12) for key, p in prompts.items()}
    batch = RunningBatch(model)
    got: dict[str, list[int]] = {}
    rows: list[str] = []  # which prompt each batch row decodes

    def decode(steps: int) -> None:
        for _ in range(steps):
            tokens, _ = sample_rows(batch.logits, [GREEDY] * batch.size, [None] * batch.size)
            for key, tok in zip(rows, tokens):
                got.setdefault(key, []).append(tok)
            batch.step(tokens)

    batch.add(prompts["a"], copies=1, budget=12)
    rows.append("a")
    decode(3)
    batch.add(prompts["b"], copies=1, budget=12)  # longer than the batch: the batch is left-padded
    rows.append("b")
    decode(2)
    batch.add(prompts["c"], copies=2, budget=12)  # two samples of one prompt share its prefill
    rows += ["c", "c2"]
    decode(4)
    batch.remove([1, 2, 3])  # "a" leaves; its padding columns are trimmed
    rows = rows[1:]
    decode(2)
    assert got["a"] == expected["a"][:9]
    assert got["b"] == expected["b"][:8]
    assert got["c"] == got["c2"] == expected["c"][:6]
    assert batch.mask.shape == (3, len(prompts["b"]) + 8)


@pytest.mark.parametrize("name", ["tiny-native", "tiny-llama"])
def test_prompts_prefilled_together_decode_as_alone(name):
    model = load_model(name, device="cpu").model
    prompts = [[5, 6, 7, 8, 9, 10], list(range(20, 40)), [70, 71, 72]]
    budgets = [12, 5, 9]
    expected = [_alone(model, p, b) for p, b in zip(prompts, budgets)]
    batch = RunningBatch(model)
    batch.add([90, 91, 92, 93], copies=1, budget=20)  # a row already decoding
    batch.step([94])
    batch.join(batch.prefill_many(prompts, [1, 2, 1], budgets))
    assert batch.budgets == [19, 12, 5, 5, 9]
    owner = [None, 0, 1, 1, 2]  # the prompt each row decodes
    got: dict[int, list[list[int]]] = {i: [[] for _ in range(owner.count(i))] for i in range(3)}
    while batch.size:
        tokens, _ = sample_rows(batch.logits, [GREEDY] * batch.size, [None] * batch.size)
        seen: dict[int, int] = {}
        for row, tok in zip(owner, tokens):
            if row is not None:
                got[row][seen.get(row, 0)].append(tok)
                seen[row] = seen.get(row, 0) + 1
        keep = [i for i, b in enumerate(batch.budgets) if b > 1]
        batch.remove(keep)
        owner = [owner[i] for i in keep]
        if keep:
            batch.step([tokens[i] for i in keep])
    assert got[0] == [expected[0]] and got[1] == [expected[1]] * 2 and got[2] == [expected[2]]


def test_prefill_many_refuses_mismatched_and_empty_inputs():
    batch = RunningBatch(load_model("tiny-llama", device="cpu").model)
    with pytest.raises(BatchError, match="one copies and one budget per prompt"):
        batch.prefill_many([[1, 2], [3]], [1], [4, 4])
    with pytest.raises(BatchError, match="at least one token"):
        batch.prefill_many([[1, 2], []], [1, 1], [4, 4])
    with pytest.raises(BatchError, match="must be >= 1"):
        batch.prefill_many([[1, 2], [3]], [1, 1], [4, 0])
    assert batch.size == 0


def test_native_cache_holds_every_budget():
    model = load_model("tiny-native", device="cpu").model
    batch = RunningBatch(model)
    batch.add([1, 2, 3], copies=1, budget=2)
    batch.add(list(range(10, 30)), copies=1, budget=5)
    batch.step([4, 4])
    batch.remove([1])
    for _ in range(4):
        batch.step([4])
    with pytest.raises(BatchError, match="budget"):
        batch.step([4])
    with pytest.raises(BatchError, match="at least one token"):
        batch.add([], copies=1, budget=3)


def test_sample_rows_uses_each_rows_generator():
    logits = torch.randn(3, 50)
    params = [SamplingParams(temperature=1.0)] * 2 + [GREEDY]
    gens = [torch.Generator().manual_seed(s) for s in (1, 1, 2)]
    tokens, logprobs = sample_rows(logits[[0, 0, 1]], params, gens, logprobs=True)
    assert tokens[0] == tokens[1]  # same logits, same seed
    assert tokens[2] == int(logits[1].argmax())
    torch.testing.assert_close(logprobs.exp().sum(-1), torch.ones(3))
    assert sample_rows(logits, [GREEDY] * 3, [None] * 3) == (logits.argmax(-1).tolist(), None)


def _sliding_window_model():
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=257, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=256, sliding_window=16,
    )  # fmt: skip
    return MistralForCausalLM(config).eval()


def test_a_prompt_that_cannot_join_leaves_the_running_batch_as_it_was():
    batch = RunningBatch(_sliding_window_model())
    batch.add([1, 2, 3], copies=1, budget=8)
    with pytest.raises(BatchError, match="--max-batch 1"):
        batch.add([4, 5], copies=2, budget=8)
    assert batch.size == 1 and batch.mask.shape == (1, 3) and batch.logits.shape[0] == 1
    batch.step([7])  # the running row goes on
    assert batch.mask.shape == (1, 4)


def test_a_sliding_window_model_is_served_only_one_row_at_a_time():
    from dsv32.engine.models import ByteTokenizer, LoadedModel
    from dsv32.serve import ServedModel, create_app

    served = ServedModel(LoadedModel(_sliding_window_model(), ByteTokenizer(), "hf"), "tiny-mistral")
    with pytest.raises(BatchError, match="sliding-window layers: serve it with --max-batch 1"):
        create_app(served, max_batch=2)
    assert create_app(served, max_batch=1).state.scheduler.max_batch == 1
