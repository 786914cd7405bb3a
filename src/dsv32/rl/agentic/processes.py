"""The processes a Ray cluster started on this machine, read from ``/proc`` (Linux): what
:meth:`dsv32.rl.agentic.fanout.RayRunner.close` waits for, and what tests and benchmarks check is gone."""

from __future__ import annotations

import os
import time
from pathlib import Path


def processes_below(root: int | None = None) -> set[int]:
    """Pids of every process below ``root`` (default: this process), read from ``/proc`` (Linux)."""
    parents = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, frontier = set(), {root or os.getpid()}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - out
        out |= frontier
    return out


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
    except OSError:
        return ""


def ray_processes() -> set[int]:
    """Ray's processes below this one (GCS, raylet, workers, actors) and everything they started."""
    ours = {p for p in processes_below() if "ray" in command_line(p)}
    return ours.union(*(processes_below(p) for p in ours))


def still_running(pids: set[int], wait: float = 10.0) -> dict[int, str]:
    """Those of ``pids`` still running (zombies excluded) after up to ``wait`` seconds: pid → command."""
    deadline = time.monotonic() + wait

    def alive() -> dict[int, str]:
        out = {}
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                out[pid] = command_line(pid)[:200]
        return out

    while (left := alive()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
