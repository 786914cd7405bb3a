"""Every benchmark script still runs against the library as it is now: each one's ``--quick`` run
(its full run where it has no ``--quick``), given an ``--out`` directory as ``make bench`` gives it,
exits 0 and writes there a JSON that ``run_all`` reads into its table. Slow (about five minutes in
all on 2 cores); ``make bench`` is what records the numbers. A GPU benchmark without a CUDA device
only has to say so and exit 0."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("run_all", ROOT / "benchmarks" / "run_all.py")
run_all = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_all)
SCRIPTS = run_all.scripts()


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_the_benchmark_runs_and_writes_its_json(script, tmp_path):
    out = tmp_path / "out"
    path, *flags = run_all.script_command(script, quick=True, out=str(out))
    done = subprocess.run(
        [sys.executable, str(ROOT / path), *flags],
        cwd=tmp_path,
        env=run_all.script_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    if script.stem.endswith("_gpu") and not torch.cuda.is_available():
        assert "CUDA" in done.stdout + done.stderr
        return
    assert (out / f"{script.stem}.json").is_file(), sorted(tmp_path.rglob("*"))
    # and make bench can read it into its results table
    section = run_all.benchmark_section(script.stem, out, since=0.0)
    assert section is not None and "| " in section
