"""``dsv32 envs list|show|run`` end to end: the reference and scripted backends on each of this
package's environments, the files ``--out`` writes, one-line errors, and SmolLM2 through
``LocalBackend`` (marked slow: one SmolLM2 turn takes over a minute on a loaded 2-core CPU)."""

import json

import pytest

from dsv32.cli import main


@pytest.fixture
def private_cache(tmp_path_factory, monkeypatch):
    """Bundles in a private cache (the SmolLM2 tests keep the shared one: it holds the converted model)."""
    monkeypatch.setenv("DSV32_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def summary_of(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_list_and_show(capsys, private_cache):
    assert main(["envs", "list"]) == 0
    listed = capsys.readouterr().out
    assert "code-interpreter" in listed and "general-tools" in listed
    assert main(["envs", "show", "general-tools", "--tasks", "smoke"]) == 0
    shown = capsys.readouterr().out
    assert "tools: " in shown and "sandbox: " in shown and "example task" in shown


@pytest.mark.parametrize("env", ["code-interpreter", "general-tools"])
def test_run_reference_scores_one(env, tmp_path, capsys, private_cache):
    out = tmp_path / "run"
    assert (
        main(["envs", "run", env, "--tasks", "smoke", "--n", "3", "--parallel", "2", "--out", str(out)]) == 0
    )
    summary = summary_of(capsys.readouterr().out)
    assert summary["mean_reward"] == 1.0 and summary["n"] == 3 and summary["backend"] == "reference"
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in rows] == [1.0, 1.0, 1.0]
    assert json.loads((out / "summary.json").read_text())["mean_reward"] == 1.0
    assert len(list((out / "trajectories").glob("*.json"))) == 3


def test_run_scripted_wrong_answer_scores_zero(tmp_path, capsys):
    script = tmp_path / "script.json"
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "python", "arguments": json.dumps({"code": "6 * 7"})},
    }
    script.write_text(
        json.dumps(
            [
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "assistant", "content": r"\boxed{-1}"},
            ]
        )
    )
    args = ["envs", "run", "code-interpreter", "--tasks", "smoke", "--n", "2", "--backend", "scripted"]
    assert main([*args, "--script", str(script)]) == 0
    out = capsys.readouterr().out
    assert summary_of(out)["mean_reward"] == 0.0 and "differs from the answer" in out


def test_errors_are_one_line(capsys, private_cache):
    assert main(["envs", "run", "code-interpreter", "--backend", "scripted"]) == 2
    assert "needs --script" in capsys.readouterr().err
    assert main(["envs", "show", "no-such-env"]) == 2
    err = capsys.readouterr().err
    assert "unknown environment" in err and len(err.strip().splitlines()) == 1
    assert main(["envs", "run", "general-tools", "--tasks", "nope"]) == 2
    assert "no task set 'nope'" in capsys.readouterr().err


def _smollm2(env: str, tmp_path, capsys, tokens: int, steps: int, n: int) -> dict:
    args = ["envs", "run", env, "--tasks", "smoke", "--backend", "local", "smollm2", "--n", str(n)]
    assert (
        main([*args, "--max-new-tokens", str(tokens), "--max-steps", str(steps), "--out", str(tmp_path)]) == 0
    )
    summary = summary_of(capsys.readouterr().out)
    assert summary["n"] == n and 0.0 <= summary["mean_reward"] <= 1.0
    return summary


@pytest.mark.slow
@pytest.mark.parametrize("env", ["code-interpreter", "general-tools"])
def test_smollm2_episodes(env, tmp_path, capsys):
    """The real small model completes episodes cleanly (its reward may well be 0)."""
    summary = _smollm2(env, tmp_path, capsys, tokens=128, steps=3, n=2)
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert all(r["stop_reason"] in ("answer", "length", "max_steps", "context", "error") for r in rows)
    assert summary["mean_reward"] == sum(r["reward"] for r in rows) / 2
