"""`dsv32 chat encode | parse | template` (thin wrappers, run in-process)."""

from __future__ import annotations

import json
from pathlib import Path

from dsv32.chat import chat_template, encode_messages
from dsv32.cli import main

FIXTURE_INPUT = Path(__file__).parent / "fixtures" / "test_input.json"


def test_encode_the_fixture(capsys, fixture_output, fixture_messages):
    assert main(["chat", "encode", str(FIXTURE_INPUT)]) == 0
    assert capsys.readouterr().out.strip() == fixture_output
    assert main(["chat", "encode", str(FIXTURE_INPUT), "--mode", "chat", "--no-bos"]) == 0
    assert capsys.readouterr().out.strip() == encode_messages(fixture_messages, "chat", add_bos=False)


def test_parse_a_completion(tmp_path, capsys, fixture_messages):
    completion = encode_messages([fixture_messages[4]], context=fixture_messages[:4])
    path = tmp_path / "completion.txt"
    path.write_text(completion, encoding="utf-8")
    assert main(["chat", "parse", str(path)]) == 0
    message = json.loads(capsys.readouterr().out)
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "get_weather"]

    path.write_text(completion[:-5], encoding="utf-8")
    assert main(["chat", "parse", str(path)]) == 2
    assert "expected the end token" in capsys.readouterr().err
    assert main(["chat", "parse", str(path), "--lenient"]) == 0
    assert len(json.loads(capsys.readouterr().out)["problems"]) == 1


def test_template_and_errors(tmp_path, capsys):
    assert main(["chat", "template"]) == 0
    assert capsys.readouterr().out == chat_template()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"role": "robot", "content": "x"}]))
    assert main(["chat", "encode", str(bad)]) == 2
    assert "message 0: unknown role 'robot'" in capsys.readouterr().err
    assert main(["chat", "encode", str(tmp_path / "missing.json")]) == 2
