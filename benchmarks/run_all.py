"""`make bench`: run every benchmark script in benchmarks/ (each writes JSON + PNG under runs/bench/).

    python benchmarks/run_all.py                 # all scripts, their full default settings
    python benchmarks/run_all.py --quick         # pass --quick to every script (a few minutes)
    python benchmarks/run_all.py --only attention model_speed

A script is any ``benchmarks/*.py`` but this one and names starting with ``_``; new ones are picked up
without editing this file (``--quick`` is passed only to scripts whose source mentions it). One
failing script does not stop the others; the exit status is non-zero if any failed. A summary goes to
``runs/bench/run_all.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def scripts() -> list[Path]:
    return sorted(
        p for p in HERE.glob("*.py") if p.name != Path(__file__).name and not p.name.startswith("_")
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="pass --quick to the scripts that support it")
    ap.add_argument("--only", nargs="*", default=None, help="script names (without .py) to run")
    ap.add_argument("--out", default="runs/bench", help="where the summary is written")
    args = ap.parse_args(argv)

    todo = [p for p in scripts() if args.only is None or p.stem in args.only]
    if args.only:
        missing = set(args.only) - {p.stem for p in todo}
        if missing:
            ap.error(f"no benchmark script named {sorted(missing)}; have {[p.stem for p in scripts()]}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    summary = []
    for script in todo:
        cmd = [sys.executable, str(script)]
        if args.quick and "--quick" in script.read_text():
            cmd.append("--quick")
        print(f"=== {script.name}: {' '.join(cmd[1:])}", flush=True)
        start = time.perf_counter()
        rc = subprocess.call(cmd, cwd=ROOT, env=env)
        elapsed = time.perf_counter() - start
        summary.append(
            {"script": script.name, "command": cmd[1:], "returncode": rc, "seconds": round(elapsed, 1)}
        )
        print(
            f"=== {script.name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {elapsed:.0f} s", flush=True
        )
    out = ROOT / args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "run_all.json").write_text(json.dumps(summary, indent=2))
    failed = [s["script"] for s in summary if s["returncode"] != 0]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
