"""The run store behind every ``dsv32 synth`` command: commit order, dedup, cost per kept task,
resume after an interruption at any point (a torn log line, tasks and artifacts of a job that never
committed), and a directory of another run kind refused."""

from __future__ import annotations

import json

import pytest

from dsv32.synth.records import Pricing, RoleUsage, SynthError, dedup_key, normalize, tool_signature
from dsv32.synth.runner import Item, JobResult, Store, run_jobs

TOOLS = [
    {
        "type": "function",
        "function": {"name": "book", "parameters": {"properties": {"hotel_id": {"type": "string"}}}},
    }
]


def _job(store: Store, key: str, prompts: list[str]) -> JobResult:
    usage = RoleUsage()
    usage.role("generator", Pricing(input=1.0, output=2.0)).add(1_000_000, 500_000)  # 1 + 1 = 2 USD
    items = []
    for i, prompt in enumerate(prompts):
        artifact = store.staging(key) / f"b{i}" if i == 0 else store.out / "staging" / key / f"b{i}"
        artifact.mkdir(parents=True, exist_ok=True)
        (artifact / "task.json").write_text("{}")
        items.append(
            Item({"id": f"{key}-{i}", "prompt": prompt, "info": {}}, prompt, tool_signature(TOOLS), artifact)
        )
    return JobResult(key, items, usage)


def _lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line]


def test_dedup_cost_and_artifacts(tmp_path):
    store = Store(tmp_path / "run", "general", {"generators": {"generator": "m"}})
    summary = run_jobs(["a", "b"], lambda key, s: _job(s, key, {"a": ["Book a hotel.", "Book a cheap hotel!"],
                                                               "b": ["book a HOTEL", "Plan a trip."]}[key]), store)  # fmt: skip
    tasks = {t["id"]: t for t in _lines(store.out / "tasks.jsonl")}
    assert set(tasks) == {"a-0", "a-1", "b-1"}  # "book a HOTEL" normalizes like "Book a hotel."
    assert summary["duplicates"] == 1 and summary["kept"] == 3 and summary["environments"] == 1
    assert tasks["a-0"]["info"]["cost_usd"] == 1.0 and tasks["b-1"]["info"]["cost_usd"] == 2.0
    assert summary["cost_usd"] == 4.0 and summary["cost_per_kept_usd"] == pytest.approx(4 / 3, abs=1e-6)
    assert (store.out / "bundles" / "a-0" / "task.json").is_file()
    assert tasks["a-0"]["info"]["bundle"] == str(store.out / "bundles" / "a-0")
    assert not (store.out / "bundles" / "b-0").exists() and not (store.out / "staging").exists()
    assert tasks["a-1"]["info"]["provenance"] == {"generators": {"generator": "m"}}
    assert json.loads((store.out / "summary.json").read_text())["kept"] == 3


def test_resume_after_an_interruption(tmp_path):
    store = Store(tmp_path / "run", "general", {})
    run_jobs(["a"], lambda key, s: _job(s, key, ["Task one."]), store)
    # an interrupted commit of job "b": its task and bundle landed, its results line is torn
    (store.out / "bundles" / "b-0").mkdir(parents=True)
    with (store.out / "tasks.jsonl").open("a") as f:
        f.write(json.dumps({"id": "b-0", "prompt": "x", "info": {"job": "b", "dedup": "zz",
                                                                  "bundle": str(store.out / "bundles" / "b-0")}}) + "\n")  # fmt: skip
    with (store.out / "results.jsonl").open("a") as f:
        f.write('{"key": "b", "status": "ke')
    (store.out / "staging" / "c").mkdir(parents=True)

    ran = []

    def work(key, s):
        ran.append(key)
        return _job(s, key, [f"Task {key}."])

    resumed = Store(tmp_path / "run", "general", {})
    assert resumed.done() == {"a"} and not (store.out / "bundles" / "b-0").exists()
    summary = run_jobs(["a", "b", "c"], work, resumed, workers=2)
    assert sorted(ran) == ["b", "c"] and summary["jobs"] == 3 and summary["kept"] == 3
    assert _lines(store.out / "results.jsonl")[0]["key"] == "a"
    assert len(_lines(store.out / "tasks.jsonl")) == 3


def test_rows_holding_unicode_line_breaks_survive_a_resume(tmp_path):
    store = Store(tmp_path / "run", "general", {})
    prompt = "Book\u2028the\x85hotel."
    run_jobs(["a", "b"], lambda key, s: _job(s, key, [f"{prompt} {key}"]), store)
    with (store.out / "results.jsonl").open("a") as f:
        f.write('{"key": "c", "status": "ke')
    resumed = Store(tmp_path / "run", "general", {})
    assert resumed.done() == {"a", "b"} and len(resumed.seen) == 2
    assert [t["prompt"] for t in _lines(store.out / "tasks.jsonl")] == [f"{prompt} a", f"{prompt} b"]
    assert (store.out / "results.jsonl").read_bytes().endswith(b"}\n")


def test_errors_are_logged_and_retried_and_kinds_do_not_mix(tmp_path):
    store = Store(tmp_path / "run", "search", {})

    def failing(key, s):
        raise SynthError("the endpoint is down")

    summary = run_jobs(["x"], failing, store)
    assert summary["jobs_with_errors"] == 1 and store.done() == set()
    summary = run_jobs(["x"], lambda key, s: JobResult(key, dropped=[{"reason": "too easy"}]), store)
    assert summary["jobs_with_errors"] == 0 and summary["dropped"] == {"too easy": 1}
    with pytest.raises(SynthError, match="holds a 'search' run, not 'general'"):
        Store(tmp_path / "run", "general", {})
    (store.out / "results.jsonl").write_text('not json\n{"key": "y"}\n')
    with pytest.raises(SynthError, match=r"results\.jsonl:1: not JSON"):
        Store(tmp_path / "run", "search", {})


def test_normalization_and_keys():
    assert normalize("  Book the CHEAPEST hotel—in Paris!  ") == "book the cheapest hotel in paris"
    assert (
        dedup_key("Book a hotel.")
        == dedup_key("book a hotel")
        != dedup_key("book a hotel", tool_signature(TOOLS))
    )
    renamed = json.loads(json.dumps(TOOLS).replace("hotel_id", "id"))
    assert tool_signature(TOOLS) != tool_signature(renamed) and tool_signature([]) == ""
    assert Pricing(1.0, 2.0, 0.5).cost(RoleUsage().role("r")) == 0.0
