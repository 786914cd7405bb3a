"""``benchmarks/run_all.py`` (``make bench``) without running a benchmark: its options, the arguments it
gives each script, and a headline table for every script."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("run_all", ROOT / "benchmarks" / "run_all.py")
run_all = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_all)


def test_only_with_no_names_is_an_error(tmp_path):
    results = tmp_path / "results.md"
    with pytest.raises(SystemExit) as exit_info:
        run_all.main(["--only", "--out", str(tmp_path / "out"), "--results", str(results)])
    assert exit_info.value.code == 2 and not results.exists()


def test_quick_and_max_wait_go_to_the_scripts_that_take_them():
    by_name = {p.stem: p for p in run_all.scripts()}
    command = run_all.script_command(by_name["attention"], quick=True, out="o", max_wait=0)
    assert command[1:] == ["--quick", "--max-wait", "0", "--out", "o"]
    command = run_all.script_command(by_name["agent_loop"], quick=True, out="o", max_wait=0)
    assert command[1:] == ["--out", "o"]
    assert "--quick" in run_all.script_command(by_name["serve_load"], quick=True)


def test_every_script_has_a_headline_table():
    assert {p.stem for p in run_all.scripts()} <= set(run_all.FORMATS)
