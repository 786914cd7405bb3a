"""Constrained decoding in the engine: the grammar's mask before temperature/top-k/top-p, text that always
follows the grammar, kept sets inside the allowed tokens, and schemas the library cannot compile."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

pytest.importorskip("llguidance")

from dsv32.engine import SamplingParams, generate, kept_mask, sample_next
from dsv32.engine.constraint import Grammar, GrammarError, allowed_rows, json_rule, vocabulary
from dsv32.engine.models import ByteTokenizer, load_model

SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "kind": {"enum": ["a", "bb"]},
        "tag": {"type": "string", "maxLength": 3},
    },
    "required": ["ok", "n", "kind"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tiny():
    loaded = load_model("tiny-llama", device="cpu")
    return loaded.model, loaded.tokenizer


def _grammar(tokenizer, model, schema=SCHEMA) -> Grammar:
    voc = vocabulary(tokenizer, model.config.vocab_size, [tokenizer.eos_token_id])
    return Grammar("start: " + json_rule(schema), voc)


def test_the_byte_vocabulary_is_text_and_the_end_token_only_ends(tiny):
    model, tokenizer = tiny
    assert isinstance(tokenizer, ByteTokenizer)
    constraint = _grammar(tokenizer, model).constraint()
    first = constraint.allowed()
    assert first.shape == (model.config.vocab_size,)
    assert first.nonzero().flatten().tolist() == [ord("{")]
    for t in b'{"ok": true, "n": 7, "kind": "a"}':
        assert constraint.allowed()[t]
        constraint.advance(t)
    assert constraint.allowed().nonzero().flatten().tolist() == [tokenizer.eos_token_id]
    with pytest.raises(GrammarError, match="not allowed"):
        constraint.advance(ord("x"))


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), [(0.0, 1.0, 0), (1.0, 1.0, 0), (0.9, 0.8, 20)])
def test_generated_text_always_validates_and_kept_sets_are_allowed(tiny, temperature, top_p, top_k):
    model, tokenizer = tiny
    grammar = _grammar(tokenizer, model)
    prompts = [list(b"json: "), list(b"an object, please "), list(b"x")] * 2
    constraints = [grammar.constraint() for _ in prompts]
    out = generate(
        model, prompts, 80, temperature, top_p, top_k, generator=torch.Generator().manual_seed(3),
        return_kept=True, constraints=constraints,
    )  # fmt: skip
    for b in range(len(prompts)):
        n = int(out.lengths[b])
        row = out.tokens[b, :n].tolist()
        assert row[-1] == tokenizer.eos_token_id, "every row completes its object and ends"
        jsonschema.validate(json.loads(bytes(row[:-1]).decode()), SCHEMA)
        replay = grammar.constraint()  # every kept id is allowed at its step
        for step, token in enumerate(row):
            kept = out.kept_token_ids[b, step]
            kept = kept[kept >= 0]
            assert token in kept.tolist() and bool(replay.allowed()[kept].all())
            replay.advance(token)


def test_sample_next_keeps_allowed_tokens_of_the_top_p_set_and_matches_the_reference():
    torch.manual_seed(0)
    logits = torch.randn(4, 300) * 3
    allowed = torch.rand(4, 300) < 0.1
    allowed[:, 0] = True
    for params in (SamplingParams(1.0, 1.0, 0), SamplingParams(0.7, 0.9, 0), SamplingParams(1.0, 0.95, 12)):
        tokens, logp, kept = sample_next(logits, params, torch.Generator().manual_seed(1), allowed)
        reference = kept_mask(logits, params, allowed)
        for b in range(4):
            ids = kept[b][kept[b] >= 0]
            assert sorted(ids.tolist()) == reference[b].nonzero().flatten().tolist()
            assert bool(allowed[b, ids].all()) and int(tokens[b]) in ids.tolist()
            constrained = (logits[b, ids] / params.temperature).log_softmax(-1)
            expected = constrained[(ids == tokens[b]).nonzero()[0, 0]]
            torch.testing.assert_close(logp[b], expected, atol=1e-6, rtol=0)


def test_a_mask_that_allows_nothing_is_an_error():
    logits = torch.zeros(1, 8)
    logits[0, 3] = float("-inf")
    allowed = torch.zeros(1, 8, dtype=torch.bool)
    allowed[0, 3] = True
    with pytest.raises(ValueError, match="allows no token"):
        sample_next(logits, SamplingParams(1.0), None, allowed)


def test_rows_without_a_constraint_are_free(tiny):
    model, tokenizer = tiny
    constraint = _grammar(tokenizer, model).constraint()
    assert allowed_rows([None, None], 10, "cpu") is None
    rows = allowed_rows([None, constraint], model.config.vocab_size, "cpu")
    assert bool(rows[0].all()) and int(rows[1].sum()) == 1


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "strin"}, "Invalid type"),
        ({"type": "object", "properties": {"a": {"$ref": "#/nope"}}}, "does not exist"),
        ({"type": "string", "format": "no-such-format"}, "Unknown format"),
        ({"not": {"type": "string"}}, "Unimplemented"),
    ],
)
def test_a_schema_the_library_cannot_compile_is_a_grammar_error(tiny, schema, message):
    model, tokenizer = tiny
    with pytest.raises(GrammarError, match=message) as err:
        _grammar(tokenizer, model, schema)
    assert "\n" not in str(err.value) and not str(err.value).startswith("at ")


def test_a_session_decodes_under_a_constraint(tiny):
    from dsv32.engine.session import Session

    model, tokenizer = tiny
    grammar = _grammar(tokenizer, model)
    session = Session(model)
    for seed in range(3):
        out = session.generate(
            list(b"json: "), max_new_tokens=80, sampling=SamplingParams(1.0), stop_ids=[tokenizer.eos_token_id],
            generator=torch.Generator().manual_seed(seed), constraint=grammar.constraint(),
        )  # fmt: skip
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(bytes(out.tokens[:-1]).decode()), SCHEMA)
