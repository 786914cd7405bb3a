"""Every ``dsv32`` subcommand, given the mistakes people make, answers with one line on stderr that
names the problem, exit code 2, no traceback — and writes nothing to its output directory.

Each leaf command must have at least one row below (``test_every_command_has_bad_input_rows``), so a
command added later cannot skip this."""

from __future__ import annotations

import argparse
import contextlib
import io
import json

import pytest

from dsv32.cli import build_parser, main

KV_MISMATCH = {"vocab_size": 10, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1,
               "num_attention_heads": 2, "num_key_value_heads": 1}  # fmt: skip


def _files(tmp) -> dict[str, str]:
    """The bad inputs, written under ``tmp``; ``{out}`` is the output directory that must stay absent."""
    (tmp / "kv.json").write_text(json.dumps(KV_MISMATCH))
    (tmp / "broken.json").write_text('{"vocab_size": 10,')
    (tmp / "robot.json").write_text(json.dumps([{"role": "robot", "content": "x"}]))
    (tmp / "cut.txt").write_text("some reasoning</think>an answer")
    (tmp / "broken.toml").write_text("[grpo\nsteps = 2\n")
    (tmp / "many.toml").write_text('[grpo]\nsteps = "many"\n')
    (tmp / "jsonl.toml").write_text('[[sources]]\nkind = "jsonl"\npath = "/no/tasks.jsonl"\n')
    (tmp / "text.txt").write_text("def f():\n    return 1\n" * 50)
    from dsv32.model import ModelConfig

    (tmp / "weights-only").mkdir()  # a checkpoint's config without a tokenizer beside it
    (tmp / "weights-only" / "config.json").write_text(json.dumps(ModelConfig().to_hf_dict()))
    return {"tmp": str(tmp), "out": str(tmp / "out"), "missing": str(tmp / "missing.json")}


# (argv with {placeholders}, what the one line must contain)
CASES = [
    (["model", "info", "{missing}"], "no model config at"),
    (["model", "info", "{tmp}/kv.json"], "num_key_value_heads=1 must equal num_attention_heads=2"),
    (["model", "info", "{tmp}/broken.json"], "is not valid JSON"),
    (["model", "demo", "--prompt-len", "0", "--out", "{out}"], "argument --prompt-len: '0' is not an integer >= 1"),
    (["generate", "{missing}", "--prompt", "hi"], "no model config at"),
    (["generate", "{tmp}", "--prompt-ids", "1", "--top-p", "2"], "argument --top-p: '2' is not a number in (0, 1]"),
    (["generate", "{tmp}"], "one of the arguments --prompt --prompt-ids is required"),
    (["chat"], "dsv32 chat: the following arguments are required: COMMAND (see 'dsv32 chat --help')"),
    (["generate", "{tmp}/weights-only", "--prompt", "hello"], "holds no tokenizer for --prompt"),
    (["chat", "encode", "{missing}"], "no such file or directory"),
    (["chat", "encode", "{tmp}/broken.json"], "malformed JSON"),
    (["chat", "encode", "{tmp}/robot.json"], "message 0: unknown role 'robot'"),
    (["chat", "parse", "{tmp}/cut.txt"], "expected the end token"),
    (["chat", "template", "extra"], "unrecognized arguments: extra"),
    (["dsa", "warmup", "--set", "warmup.lr=-1", "--out", "{out}"], "[warmup] lr = -1: must be > 0"),
    (["dsa", "warmup", "--steps", "abc", "--out", "{out}"], "argument --steps: invalid int value: 'abc'"),
    (["dsa", "warmup", "--model", "no-such-model", "--data", "{tmp}/text.txt", "--out", "{out}"],
     "cannot load model 'no-such-model'"),
    (["dsa", "sparse", "--topk", "0", "--out", "{out}"], "[dsa] index_topk = 0: must be >= 1"),
    (["dsa", "sparse", "--data", "{tmp}/nothing-here", "--out", "{out}"], "[data] source ="),
    (["dsa", "eval", "--config", "{tmp}/broken.toml", "--out", "{out}"], "is not valid TOML"),
    (["dsa", "eval", "--config", "{tmp}/absent.toml", "--out", "{out}"], "cannot read recipe"),
    (["demo", "--set", "warmup.steps=0", "--out", "{out}"], "[warmup] steps = 0: must be >= 1"),
    (["demo", "--set", "nonsense", "--out", "{out}"], "must look like section.field=value"),
    (["rl", "train", "{tmp}/many.toml", "--out", "{out}"], '[grpo] steps = "many": must be an integer'),
    (["rl", "train", "--set", "grpo.group_size=1", "--out", "{out}"], "[grpo] group_size = 1: must be >= 2"),
    (["rl", "train", "--steps", "0", "--out", "{out}"], "[grpo] steps = 0: must be >= 1"),
    (["rl", "train", "--set", "sampling.top_p=1.5", "--out", "{out}"], "[sampling] top_p = 1.5: must be in (0, 1]"),
    (["rl", "train", "{tmp}/jsonl.toml", "--out", "{out}"], "a jsonl source needs an existing JSONL file"),
    (["rl", "train", "--policy", "no-such-policy", "--steps", "1", "--out", "{out}"],
     "cannot load model 'no-such-policy'"),
    (["rl", "eval", "{tmp}/broken.toml", "--out", "{out}"], "is not valid TOML"),
    (["rl", "eval", "--policy", "{missing}", "--out", "{out}"], "missing.json': there is no such directory"),
]  # fmt: skip


def _more_cases() -> list:
    """Command groups keep their rows beside this file as ``cases_<group>.py`` defining ``CASES`` (the
    same shape; ``_files`` may be extended by a ``files(tmp)`` function there)."""
    import importlib.util
    from pathlib import Path

    rows = []
    for path in sorted(Path(__file__).parent.glob("cases_*.py")):
        spec = importlib.util.spec_from_file_location(f"_bad_input_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        rows += [(*row, getattr(module, "files", None)) for row in module.CASES]
    return rows


CASES = [(*row, None) for row in CASES] + _more_cases()


@pytest.mark.parametrize(("argv", "expected", "files"), CASES, ids=[" ".join(c[0][:3]) for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    argv, expected, files, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory either (runs/...)
    names = _files(tmp_path) | (files(tmp_path) if files else {})
    argv = [a.format(**names) for a in argv]
    with pytest.raises(SystemExit) if _is_usage_error(argv) else _no_raise() as exit_info:
        code = main(argv)
    if exit_info is not None:
        code = exit_info.value.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("dsv32 "), err
    assert expected in lines[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "runs").exists()


class _no_raise:
    value = None

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _is_usage_error(argv: list[str]) -> bool:
    """argparse rejects these before any command runs (it exits through SystemExit(2))."""
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit:
        return True
    return False


def _leaf_commands(parser: argparse.ArgumentParser, prefix=()) -> list[tuple[str, ...]]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not actions:
        return [prefix]
    return [leaf for name, sub in actions[0].choices.items() for leaf in _leaf_commands(sub, (*prefix, name))]


def test_every_command_has_bad_input_rows():
    leaves = _leaf_commands(build_parser())
    covered = {tuple(argv[: len(leaf)]) for argv, *_ in CASES for leaf in leaves}
    missing = [" ".join(leaf) for leaf in leaves if leaf not in covered]
    assert not missing, f"add bad-input rows for: {missing}"


def test_debug_shows_the_traceback(tmp_path):
    from dsv32.model.config import ConfigError

    with pytest.raises(ConfigError):
        main(["--debug", "model", "info", str(tmp_path / "missing.json")])
    with pytest.raises(ConfigError):
        main(["model", "info", str(tmp_path / "missing.json"), "--debug"])


def test_a_bug_keeps_its_traceback(monkeypatch):
    import dsv32.chat

    def broken():
        raise KeyError("a bug, not a user mistake")

    monkeypatch.setattr(dsv32.chat, "chat_template", broken)
    with pytest.raises(KeyError):
        main(["chat", "template"])
