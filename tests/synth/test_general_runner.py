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

    store.close()  # the first run ended
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
    store.close()  # the first run ended
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


def _snapshot(root):
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize("name", ["tasks.jsonl", "results.jsonl", "summary.json", "staging", "bundles"])
def test_a_directory_without_run_json_that_holds_run_files_is_refused_untouched(tmp_path, name):
    keep = tmp_path / "my_bundle_keep"
    keep.mkdir()
    (keep / "important.txt").write_text("keep me")
    out = tmp_path / "mydir"
    out.mkdir()
    row = {"id": "t", "prompt": "p", "info": {"job": "j", "dedup": "d", "bundle": str(keep)}}
    (out / "tasks.jsonl").write_text(json.dumps(row) + "\n")  # a user's task file, kept whatever the case
    if name == "staging" or name == "bundles":
        (out / name).mkdir()
    elif name != "tasks.jsonl":
        (out / name).write_text("{}\n")
    before = _snapshot(tmp_path)
    with pytest.raises(SynthError, match=r"but no run\.json, so it is not a synthesis run directory"):
        Store(out, "filter", {})
    assert _snapshot(tmp_path) == before


def test_a_directory_of_other_files_may_hold_a_run(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    store = Store(tmp_path, "general", {})
    run_jobs(["a"], lambda key, s: _job(s, key, ["Task one."]), store)
    assert (tmp_path / "notes.txt").read_text() == "mine" and (tmp_path / "run.json").is_file()


def test_uncommitted_tasks_take_only_their_own_bundles_with_them(tmp_path):
    store = Store(tmp_path / "run", "general", {})
    run_jobs(["a"], lambda key, s: _job(s, key, ["Task one."]), store)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "important.txt").write_text("keep me")
    (store.out / "bundles" / "link").symlink_to(outside)
    own = store.out / "bundles" / "b-0"
    own.mkdir()
    bundles = [str(outside), str(store.out), str(store.out / "bundles"),
               str(store.out / "bundles" / ".." / ".." / "outside"), str(store.out / "bundles" / "link"), str(own)]  # fmt: skip
    with (store.out / "tasks.jsonl").open("a") as f:
        for i, bundle in enumerate(bundles):
            f.write(json.dumps({"id": f"b-{i}", "prompt": "x", "info": {"job": "b", "dedup": f"z{i}", "bundle": bundle}}) + "\n")  # fmt: skip
    store.close()  # the first run ended
    resumed = Store(tmp_path / "run", "general", {})
    assert resumed.done() == {"a"} and len(_lines(store.out / "tasks.jsonl")) == 1
    assert not own.exists() and (outside / "important.txt").read_text() == "keep me"
    assert (store.out / "bundles" / "a-0" / "task.json").is_file() and (store.out / "run.json").is_file()


def test_job_keys_and_task_ids_never_name_a_path_outside_the_run(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    store = Store(tmp_path / "run", "filter", {}, artifacts=None)
    summary = run_jobs(["../../victim"], lambda key, s: JobResult(key, dropped=[{"reason": "r"}]), store)
    assert summary["jobs"] == 1 and victim.is_dir()
    with pytest.raises(SynthError, match="cannot name a directory"):
        store.staging("../victim")
    general = Store(tmp_path / "general", "general", {})
    item = Item({"id": "../../victim", "prompt": "p", "info": {}}, "p", "", general.staging("k"))
    row = run_jobs(["k"], lambda key, s: JobResult(key, [item]), general)
    assert row["jobs_with_errors"] == 1 and "artifact cannot be kept" in row["first_error"]
    assert victim.is_dir() and not (general.out / "tasks.jsonl").exists()


RUN = json.dumps({"kind": "filter", "provenance": {"generators": {"policy": "m"}, "settings": {"k": 1}}})
GOOD = json.dumps({"key": "t", "status": "dropped", "kept": [], "duplicates": [], "dropped": []})


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"run.json": "[1, 2]"}, r"run\.json: not a synthesis run record"),
        ({"run.json": '{"kind": "filter"'}, r"run\.json: not JSON"),
        ({"run.json": '{"kind": 3, "provenance": {}}'}, r"run\.json: not a synthesis run record"),
        (
            {"run.json": RUN, "results.jsonl": '{"foo": 1}\n'},
            r"results\.jsonl:1: not a synthesis result \(no job 'key'\)",
        ),
        (
            {"run.json": RUN, "results.jsonl": f"{GOOD}\n[1]\n"},
            r"results\.jsonl:2: not a synthesis result \(expected a JSON object",
        ),
        (
            {
                "run.json": RUN,
                "results.jsonl": GOOD.replace('"status": "dropped"', '"status": "done"') + "\n",
            },
            r"'status' is 'done'",
        ),
        (
            {"run.json": RUN, "results.jsonl": GOOD.replace('"kept": []', '"kept": 1') + "\n"},
            r"'kept' is not a list",
        ),
        (
            {"run.json": RUN, "results.jsonl": f"{GOOD}\n", "tasks.jsonl": '{"id": "x", "prompt": "p"}\n'},
            r"tasks\.jsonl:1: not a synthesized task \(no 'info' object",
        ),
        (
            {"run.json": RUN, "tasks.jsonl": '{"id": "x", "info": {"job": "t"}}\n{"id": "y", "info": {'},
            r"tasks\.jsonl:1: not a synthesized task",
        ),
    ],
)
def test_foreign_or_corrupt_run_files_are_refused_before_anything_is_written(tmp_path, files, message):
    out = tmp_path / "run"
    out.mkdir()
    for name, text in files.items():
        (out / name).write_text(text)
    with (out / "results.jsonl").open("a") as f:
        f.write('{"key": "torn')  # left as it is: nothing is written
    before = _snapshot(out)
    with pytest.raises(SynthError, match=message):
        Store(out, "filter", {"generators": {"policy": "m"}, "settings": {"k": 1}}, artifacts=None)
    assert _snapshot(out) == before


def test_a_run_resumes_only_with_its_own_generators_and_settings(tmp_path):
    def provenance(policy="m", k=1, limit=1):
        return {"generators": {"policy": policy}, "settings": {"k": k, "limit": limit}, "date": "any"}

    Store(tmp_path, "filter", provenance(), artifacts=None, scope=("limit",))
    (tmp_path / "results.jsonl").write_text(GOOD + "\n")
    resumed = Store(tmp_path, "filter", provenance(limit=3), artifacts=None, scope=("limit",))
    assert resumed.done() == {"t"}
    with pytest.raises(SynthError, match=r"other settings \(policy 'm' -> 'other'; k 1 -> 4\); run it with"):
        Store(tmp_path, "filter", provenance("other", k=4), artifacts=None, scope=("limit",))
    with pytest.raises(SynthError, match=r"other settings \(limit 1 -> 3\)"):
        Store(tmp_path, "filter", provenance(limit=3), artifacts=None)
    assert json.loads((tmp_path / "run.json").read_text())["provenance"] == provenance()


def test_a_second_run_on_a_directory_in_use_is_refused_and_changes_nothing(tmp_path):
    first = Store(tmp_path / "run", "general", {})
    run_jobs(["a"], lambda key, s: _job(s, key, ["Task one."]), first)
    (first.staging("b") / "b0").mkdir()  # job "b" of the first run is under way
    before = _snapshot(tmp_path)
    with pytest.raises(SynthError, match=r"another run is using .*run \(it holds .*\.lock\)"):
        Store(tmp_path / "run", "general", {})
    assert _snapshot(tmp_path) == before
    first.record(_job(first, "b", ["Task two."]))
    first.close()
    with Store(tmp_path / "run", "general", {}) as resumed:
        assert resumed.done() == {"a", "b"} and (resumed.out / "bundles" / "b-0").is_dir()


def test_tasks_left_by_an_interrupted_retry_of_an_errored_job_are_removed(tmp_path):
    def failing(key, s):
        raise SynthError("endpoint down")

    with Store(tmp_path / "run", "general", {}) as store:
        assert run_jobs(["a"], failing, store)["jobs_with_errors"] == 1
        # the retry committed its task and bundle, then was killed before its results line
        store.record(_job(store, "a", ["Task one."]))
    results = store.out / "results.jsonl"
    results.write_text(results.read_text().splitlines(keepends=True)[0])
    with Store(tmp_path / "run", "general", {}) as resumed:
        assert resumed.seen == set() and not (store.out / "bundles" / "a-0").exists()
        summary = run_jobs(["a"], lambda key, s: _job(s, key, ["Task one."]), resumed)
    assert summary["kept"] == 1 and summary["duplicates"] == 0 and summary["jobs_with_errors"] == 0
    assert [t["id"] for t in _lines(store.out / "tasks.jsonl")] == ["a-0"]
