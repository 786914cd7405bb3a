"""A minute of ``benchmarks/serve_soak.py``: mixed requests (streamed and not, tools, cancellations,
client disconnects) with weight updates between phases — no 5xx, seen by the clients or counted by
the server, and the server's memory flat once warm."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "serve_soak.py"
SECONDS = 60


@pytest.mark.slow
def test_a_minute_of_mixed_load_with_weight_updates_has_no_5xx_and_flat_memory(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", str(SECONDS), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=SECONDS + 300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == json.loads((tmp_path / "serve_soak.json").read_text())
    assert (tmp_path / "serve_soak.png").stat().st_size > 0
    assert result["client_5xx"] == 0 and result["server_5xx"] == 0, result.get("client_5xx_examples")
    assert result["server_alive_after"] and result["transport_errors"] == 0
    assert result["skipped_kinds"] == []  # chat and tools too
    kinds = result["by_kind"]
    assert kinds["cancel_stream"]["statuses"] == {"client_cancelled": kinds["cancel_stream"]["requests"]}
    assert kinds["disconnect"]["requests"] > 0 and all(k["requests"] > 0 for k in kinds.values())
    updates = result["weight_updates"]
    assert len(updates) == 3 and [u.get("served_version") for u in updates] == [1, 2, 3], updates
    # memory: bounded growth once the first phase warmed the caches and the allocator
    grown = result["rss_end_mb"] - result["rss_after_first_phase_mb"]
    assert grown < 64 and result["rss_slope_mb_per_min"] < 30, (grown, result["rss_slope_mb_per_min"])
    print({k: result[k] for k in ("requests", "latency_p50_s", "latency_p99_s", "rss_start_mb", "rss_end_mb",
                                  "rss_slope_mb_per_min", "machine")})  # fmt: skip
