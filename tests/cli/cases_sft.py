"""Bad-input rows of ``dsv32 sft`` (read by test_bad_input.py)."""

from __future__ import annotations

import json

CONVERSATION = {
    "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "add"},
    ]
}


def files(tmp) -> dict[str, str]:
    (tmp / "conv.jsonl").write_text(json.dumps(CONVERSATION) + "\n")
    (tmp / "notjson.jsonl").write_text(json.dumps(CONVERSATION) + "\n{oops\n")
    (tmp / "robot.jsonl").write_text(json.dumps({"messages": [{"role": "robot", "content": "x"}]}) + "\n")
    return {}


_SFT = ["sft", "--model", "tiny-llama", "--out", "{out}"]

CASES = [
    (["sft", "--data", "{missing}", "--out", "{out}"], "[data] path ="),
    (["sft", "{tmp}/broken.toml", "--out", "{out}"], "is not valid TOML"),
    (["sft", "--data", "{tmp}/conv.jsonl", "--set", "train.lr=-1", "--out", "{out}"], "[train] lr = -1: must be > 0"),
    (["sft", "--data", "{tmp}/conv.jsonl", "--set", "data.thinking_mode=deep", "--out", "{out}"],
     "[data] thinking_mode = \"deep\": must be one of 'thinking', 'chat'"),
    (["sft", "--steps", "0"], "argument --steps: '0' is not an integer >= 1"),
    ([*_SFT, "--data", "{tmp}/notjson.jsonl"], "notjson.jsonl:2: not JSON"),
    ([*_SFT, "--data", "{tmp}/robot.jsonl"], "unknown role 'robot'"),
    (["sft", "--model", "no-such-model", "--data", "{tmp}/conv.jsonl", "--out", "{out}"],
     "cannot load model 'no-such-model'"),
]  # fmt: skip
