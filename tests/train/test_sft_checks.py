"""What ``dsv32 sft`` checks before anything is written, and how it reports what it leaves out."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from dsv32.train.sft import SFTConfigError, load_sft_config, train_sft


def _conversation(i: int) -> dict:
    return {
        "messages": [
            {"role": "user", "content": f"q{i}"},
            {"role": "assistant", "reasoning_content": "r" * (i + 1), "content": f"a{i}"},
        ]
    }


def _cfg(tmp_path, rows=None, **over):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows or [_conversation(i) for i in range(4)]))
    sets = {
        "model.name": "tiny-llama", "model.device": "cpu", "data.path": str(data), "data.seq_len": 256,
        "train.batch_size": 2, "train.steps": 1, "out_dir": str(tmp_path / "run"),
    } | over  # fmt: skip
    return load_sft_config(None, [f"{k}={json.dumps(v)}" for k, v in sets.items()])


def test_a_seq_len_past_the_models_positions_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(
        SFTConfigError, match=r"data\.seq_len = 2048 exceeds the model's max_position_embeddings \(1024\)"
    ):
        train_sft(_cfg(tmp_path, **{"data.seq_len": 2048}), progress=False)
    assert not (tmp_path / "run").exists()


def test_dropped_overlong_conversations_are_reported(tmp_path, caplog):
    rows = [_conversation(i) for i in range(4)] + [{"messages": [
        {"role": "user", "content": "long " * 80}, {"role": "assistant", "reasoning_content": "r", "content": "ok"}]}]  # fmt: skip
    with caplog.at_level("WARNING", logger="dsv32.train.sft.data"):
        result = train_sft(_cfg(tmp_path, rows, **{"data.seq_len": 128}), progress=False, save_model=False)
    assert result.data["dropped"] == 1 and result.data["conversations"] == 5
    assert "dropped 1 of 5 (longer than seq_len)" in result.summary()
    assert "dropped 1 of 5 conversations longer than seq_len=128" in caplog.text


def test_a_truncation_that_leaves_no_assistant_token_drops_the_conversation(tmp_path, caplog):
    long_prompt = {"messages": [{"role": "system", "content": "S" * 200}, *_conversation(9)["messages"]]}
    rows = [_conversation(i) for i in range(4)] + [long_prompt]
    with caplog.at_level("WARNING", logger="dsv32.train.sft.data"):
        result = train_sft(
            _cfg(tmp_path, rows, **{"data.seq_len": 128, "data.overlong": "truncate"}),
            progress=False,
            save_model=False,
        )
    assert result.data["dropped_no_loss"] == 1 and result.data["truncated"] == 0
    assert result.data["conversations"] == 5 and result.data["dropped"] == 0
    assert "dropped 1 of 5 (no assistant token in seq_len)" in result.summary()
    assert "dropped 1 of 5 conversations whose first 128 tokens hold no assistant token" in caplog.text


def test_the_same_data_under_another_path_resumes(tmp_path):
    import shutil

    from dsv32.runlog import read_metrics

    first = _cfg(tmp_path, **{"train.steps": 2})
    train_sft(first, progress=False, save_model=False)
    moved = tmp_path / "elsewhere" / "copy.jsonl"
    moved.parent.mkdir()
    shutil.copy(first.data.path, moved)
    again = _cfg(tmp_path / "elsewhere", **{"train.steps": 3, "out_dir": str(tmp_path / "run")})
    again.data.path = str(moved)
    result = train_sft(again, progress=False, save_model=False)
    assert result.steps == 3 and [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [
        1,
        2,
        3,
    ]


@pytest.mark.parametrize("first", [[{"role": "system", "content": "You are a bot."}], []])
def test_an_assistant_turn_before_any_user_message_names_the_line(tmp_path, tokenizer, first):
    from dsv32.train.sft.data import SFTDataError, encode_file

    bad = {"messages": [*first, {"role": "assistant", "reasoning_content": "r", "content": "hello"}]}
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(_conversation(1)) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(
        SFTDataError, match=rf"c\.jsonl:2: message {len(first)}: an assistant turn before any user"
    ):
        encode_file(tokenizer, path, seq_len=256)
