"""``dsv32 synth envs``: writes the set, plays a sample in the sandbox, gives the same bytes when run
again with the same seed, refuses a directory it did not write, and keeps a set in the cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv32.cli import main


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV32_CACHE_DIR", str(tmp_path / "cache"))


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _summary(capsys) -> dict:
    out = capsys.readouterr().out
    return json.loads(out[out.index("{") :])


def test_the_command_writes_a_set_and_a_second_run_writes_the_same_bytes(tmp_path, capsys):
    out = tmp_path / "envs"
    args = ["synth", "envs", "--n", "4", "--seed", "2", "--out", str(out)]
    assert main([*args, "--sandbox", "1"]) == 0
    summary = _summary(capsys)
    assert summary["environments"] == 4 and summary["tasks"] == 8
    assert summary["sandbox"] == {"checked": 1, "failed": []}
    assert {"manifest.json", "tasks.jsonl", "train.jsonl", "heldout.jsonl"} <= {p.name for p in out.iterdir()}
    first = _files(out)
    assert len([k for k in first if k.endswith("task.json")]) == 8
    assert main([*args, "--sandbox", "0"]) == 0
    assert _files(out) == first
    elsewhere = tmp_path / "elsewhere"
    assert main(["synth", "envs", "--n", "4", "--seed", "2", "--out", str(elsewhere), "--sandbox", "0"]) == 0
    assert _files(elsewhere / "bundles") == {
        k[len("bundles/") :]: v for k, v in first.items() if k.startswith("bundles/")
    }


def test_a_directory_it_did_not_write_is_refused(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert main(["synth", "envs", "--n", "2", "--out", str(mine), "--sandbox", "0"]) == 2
    assert "did not write" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_without_out_the_set_is_kept_in_the_cache(tmp_path, capsys):
    assert main(["synth", "envs", "--n", "3", "--heldout-domain", "zoo", "--sandbox", "0"]) == 0
    summary = _summary(capsys)
    assert summary["out"].startswith(str(tmp_path / "cache")) and summary["split"]["heldout"] == ["zoo"]
    stamp = Path(summary["out"], "manifest.json").stat().st_mtime_ns
    assert main(["synth", "envs", "--n", "3", "--heldout-domain", "zoo", "--sandbox", "0"]) == 0
    assert _summary(capsys)["out"] == summary["out"]
    assert Path(summary["out"], "manifest.json").stat().st_mtime_ns == stamp
