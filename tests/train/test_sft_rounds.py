"""Reasoning of earlier rounds: ``train_on="all"`` renders those turns without it (§3.2.1) and
counts what is lost; ``train_on="each_round"`` trains every round with its reasoning."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from dsv32.train.sft import load_sft_config
from dsv32.train.sft.data import IGNORE, encode_file, round_rows

TWO_ROUNDS = {
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2*3?"},
        {"role": "assistant", "reasoning_content": "FIRST-THOUGHT", "content": "6"},
        {"role": "user", "content": "3*4?"},
        {"role": "assistant", "reasoning_content": "SECOND-THOUGHT", "content": "12"},
    ]
}


def _trained(tokenizer, example) -> str:
    return tokenizer.decode([t for t in example.targets if t != IGNORE])


def _encode(tokenizer, tmp_path, train_on):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(TWO_ROUNDS) + "\n")
    return encode_file(tokenizer, path, seq_len=1024, train_on=train_on)


def test_all_counts_the_earlier_reasoning_it_cannot_train(tokenizer, tmp_path, caplog):
    with caplog.at_level("WARNING", logger="dsv32.train.sft.data"):
        (example,), counts = _encode(tokenizer, tmp_path, "all")
    trained = _trained(tokenizer, example)
    assert "FIRST-THOUGHT" not in trained and "SECOND-THOUGHT" in trained and "6" in trained
    assert counts["untrained_reasoning_chars"] == len("FIRST-THOUGHT")
    assert counts["untrained_reasoning_tokens"] == len("FIRST-THOUGHT")  # one byte, one token
    assert "13 tokens of reasoning in turns before the last user message" in caplog.text


def test_each_round_trains_every_round_with_its_reasoning(tokenizer, tmp_path):
    examples, counts = _encode(tokenizer, tmp_path, "each_round")
    assert counts["conversations"] == 1 and counts["examples"] == 2
    assert counts["untrained_reasoning_chars"] == 0
    first, second = (_trained(tokenizer, e) for e in examples)
    assert "FIRST-THOUGHT" in first and "6" in first and "12" not in first
    assert "SECOND-THOUGHT" in second and "12" in second
    assert "FIRST-THOUGHT" not in second and "6" not in second  # round 1 is context there, no loss
    assert [len(c["messages"]) for c in round_rows(TWO_ROUNDS)] == [3, 5]


def test_each_round_is_a_recipe_value(tmp_path):
    data = tmp_path / "c.jsonl"
    data.write_text(json.dumps(TWO_ROUNDS) + "\n")
    cfg = load_sft_config(None, [f"data.path={data}", "data.train_on=each_round"])
    assert cfg.data.train_on == "each_round"
