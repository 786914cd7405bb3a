"""Directories a SIGKILLed process leaves: its sandboxes', its kernel's and its ``/etc`` files' are swept
by the next process's first sandbox use — and never one whose owner lives, nor one whose pid was
reused by a later process, nor one without an owner in its name."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dsv32.envs import sandbox
from dsv32.envs.sandbox.leftovers import leftovers, owner, owner_tag, start_time, sweep_leftovers

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="owners are read from /proc")

HOLD = """
import json, sys, time
from dsv32.envs import sandbox
from dsv32.envs.interpreter.kernel import SandboxedKernel
paths = [sandbox.owned_tempdir("sandbox"), __import__("os").path.dirname(sandbox._etc_files()["/etc/passwd"])]
if sys.argv[1] == "kernel":
    kernel = SandboxedKernel()
    paths += [kernel.workdir, kernel._run_dir]
print(json.dumps(paths), flush=True)
time.sleep(600)
"""


def _holder(tmp: Path, kernel: bool) -> tuple[subprocess.Popen, list[str]]:
    """A process that made sandbox directories under ``tmp`` (and a kernel's) and holds them."""
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, "kernel" if kernel else "plain"],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    line = proc.stdout.readline()
    assert line, f"the holder exited with {proc.wait()}"
    return proc, json.loads(line)


@pytest.fixture
def short_tmp():
    """A temp dir of a short path: a kernel's socket path must fit in 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="dsv32t-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_first_sandbox_use_sweeps_what_a_killed_process_left_and_nothing_else(short_tmp):
    tmp_path = short_tmp
    dead, dead_paths = _holder(tmp_path, kernel=True)
    live, live_paths = _holder(tmp_path, kernel=False)
    try:
        names = [Path(p).name for p in dead_paths]
        assert [n.split("-")[1] for n in names] == ["sandbox", "etc", "kernel", "kernel"]
        assert {owner(n) for n in names} == {(dead.pid, start_time(dead.pid))}  # the owner in the name
        os.kill(dead.pid, signal.SIGKILL)  # no exit handler runs: everything stays
        dead.wait(timeout=30)
        assert all(os.path.isdir(p) for p in dead_paths)
        own = start_time(os.getpid())
        reused = tmp_path / f"dsv32-sandbox-{owner_tag(os.getpid(), own + 1)}-x"  # this pid, another start
        untagged = tmp_path / "dsv32-sandbox-abc123"  # no owner in the name: cannot tell, kept
        for d in (reused, untagged):
            d.mkdir()
        # a fresh process: its first sandbox run sweeps (once)
        code = "from dsv32.envs import sandbox; print(sandbox.run(['true'], timeout_s=30, memory_mb=256).returncode)"
        done = subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, "TMPDIR": str(tmp_path)},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.stdout.strip() == "0", done.stderr[-2000:]
        assert [p for p in dead_paths if os.path.exists(p)] == []
        assert not reused.exists()
        assert untagged.is_dir() and all(os.path.isdir(p) for p in live_paths)  # owner alive: kept
        assert live.poll() is None
    finally:
        for proc in (dead, live):
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
    # the live holder is gone now: its directories are leftovers too
    assert sorted(str(p) for p in leftovers(tmp_path)) == sorted(live_paths)
    assert sorted(str(p) for p in sweep_leftovers(tmp_path)) == sorted(live_paths)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("dsv32-")) == [untagged.name]


def test_a_directory_of_this_process_is_never_swept(tmp_path):
    mine = tmp_path / f"dsv32-kernel-{owner_tag()}-y"
    mine.mkdir()
    assert leftovers(tmp_path) == [] and sweep_leftovers(tmp_path) == [] and mine.is_dir()
    made = sandbox.owned_tempdir("sandbox")
    try:
        assert Path(made).name.startswith(f"dsv32-sandbox-{owner_tag()}-")
    finally:
        os.rmdir(made)
    with pytest.raises(ValueError, match="unknown sandbox directory kind"):
        sandbox.owned_tempdir("other")
