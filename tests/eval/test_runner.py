"""The runner: reference runs score 100 %, files are written, interrupted runs resume, settings are
checked, and several runs go side by side."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dsv32.eval import RunSettings, rescore, run, side_by_side
from dsv32.eval.byo import Boxed
from dsv32.eval.errors import EvalError
from dsv32.eval.report import load_results


def test_reference_run_writes_results_samples_and_report(tmp_path):
    out = tmp_path / "rg"
    results = run(
        RunSettings("reasoning-gym", subset=["gcd", "syllogism"], limit=60, n=2), out, progress=False
    )
    assert results["metrics"]["pass@1"]["value"] == 1.0
    assert results["metrics"]["pass@2"]["value"] == 1.0
    assert set(results["subsets"]) == {"gcd", "syllogism"}
    saved = load_results(out)
    for key in ("benchmark", "model", "settings", "date", "git_commit", "metrics", "excluded", "paper"):
        assert key in saved
    assert saved["settings"]["temperature"] == 1.0 and saved["settings"]["thinking"] is True
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 120
    assert {"prompt", "completion", "score", "reason"} <= set(rows[0])
    report = (out / "report.md").read_text()
    assert "| accuracy (pass@1) | 100.0 [" in report and "| gcd |" in report


def test_interrupted_run_resumes_from_the_samples(tmp_path):
    out = tmp_path / "he"
    settings = RunSettings("humaneval", limit=3)
    run(settings, out, progress=False)
    lines = (out / "samples.jsonl").read_text().splitlines()
    # drop one finished sample and cut the last line short, as an interrupted write leaves it
    (out / "samples.jsonl").write_text(lines[0] + "\n" + lines[1][:40])
    kept = json.loads(lines[0])["id"]  # lines come in the order the samples were scored
    results = run(settings, out, progress=False)
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert rows[0]["id"] == kept and len(rows) == 3  # kept, not redone
    assert results["metrics"]["pass@1"]["value"] == 1.0


def test_more_problems_extend_a_finished_run(tmp_path):
    out = tmp_path / "x"
    run(RunSettings("reasoning-gym", subset=["lcm"], limit=2), out, progress=False)
    results = run(RunSettings("reasoning-gym", subset=["lcm"], limit=4), out, progress=False)
    assert results["problems"] == 4
    assert len((out / "samples.jsonl").read_text().splitlines()) == 4


def test_other_settings_are_refused_unless_fresh(tmp_path):
    out = tmp_path / "x"
    run(RunSettings("reasoning-gym", subset=["lcm"], limit=2), out, progress=False)
    with pytest.raises(EvalError, match=r"other settings .*temperature 1\.0 -> 0\.5"):
        run(RunSettings("reasoning-gym", subset=["lcm"], limit=2, temperature=0.5), out, progress=False)
    results = run(
        RunSettings("reasoning-gym", subset=["lcm"], limit=2, temperature=0.5),
        out,
        fresh=True,
        progress=False,
    )
    assert results["settings"]["temperature"] == 0.5


def test_a_corrupt_settings_file_is_named(tmp_path):
    out = tmp_path / "x"
    run(RunSettings("reasoning-gym", subset=["lcm"], limit=1), out, progress=False)
    for text in ('{"benchmark": "reason', "[1, 2]"):
        (out / "settings.json").write_text(text)
        with pytest.raises(EvalError, match=r"settings\.json: not "):
            run(RunSettings("reasoning-gym", subset=["lcm"], limit=1), out, progress=False)


def test_bad_inputs_write_nothing(tmp_path):
    out = tmp_path / "out"
    for settings, message in [
        (RunSettings("no-such-bench"), "unknown benchmark"),
        (RunSettings("byo-boxed"), "--data"),
        (RunSettings("bfcl", subset=["nope"]), "no category"),
        (RunSettings("byo-boxed", data=str(tmp_path / "missing.jsonl")), "no such file"),
    ]:
        with pytest.raises(EvalError, match=message):
            run(settings, out, progress=False)
    assert not out.exists()
    with pytest.raises(EvalError, match="greedy"):
        RunSettings("humaneval", backend="openai", temperature=0, n=4)
    with pytest.raises(EvalError, match=r"RunSettings\.top_p = 0: must be in \(0, 1\]"):
        RunSettings("humaneval", top_p=0)
    with pytest.raises(
        EvalError, match=r"RunSettings\.context = \"forget\": must be one of 'none', 'summary'"
    ):
        RunSettings("humaneval", context="forget")


def test_agentic_reference_episodes_score_one_and_record_their_cost(tmp_path):
    results = run(RunSettings("agent-code-interpreter", limit=2), tmp_path / "ci", progress=False)
    assert results["metrics"]["pass@1"]["value"] == 1.0
    assert results["agentic"]["steps_mean"] >= 1 and results["agentic"]["resets_mean"] == 0
    row = json.loads((tmp_path / "ci" / "samples.jsonl").read_text().splitlines()[0])
    assert {"steps", "tokens", "resets", "messages", "stop_reason"} <= set(row)


def test_bfcl_reference_run_records_what_it_left_out(tmp_path):
    results = run(RunSettings("bfcl", subset=["live_simple"]), tmp_path / "b", progress=False)
    assert results["metrics"]["pass@1"]["value"] == 1.0
    assert set(results["excluded"]) == {"live_simple_106-63-0", "live_simple_112-68-0"}


def test_side_by_side_and_paper_column(tmp_path):
    data = tmp_path / "aime.jsonl"
    data.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\n")
    run(RunSettings("byo-boxed", data=str(data), paper="aime-2025"), tmp_path / "a", progress=False)
    run(RunSettings("reasoning-gym", subset=["gcd"], limit=2), tmp_path / "b", progress=False)
    table = side_by_side([tmp_path / "a", tmp_path / "b"])
    assert "paper (DeepSeek-V3.2)" in table
    assert "| byo-boxed | accuracy (pass@1) | 100.0" in table and "93.1 (Table 2" in table
    assert "| reasoning-gym | accuracy (pass@1) | - | 100.0" in table
    assert "| reasoning-gym | problems |  | 2 |" in table and "WARNING" not in table  # one run per benchmark
    with pytest.raises(EvalError, match=r"no results\.json"):
        side_by_side([tmp_path / "nothing"])


@pytest.mark.slow
def test_byo_swe_reference_resolves_a_shipped_swe_task(tmp_path):
    from dsv32.envs.swe import SHIPPED_TASKS

    task = json.loads(SHIPPED_TASKS.read_text().splitlines()[0])
    row = {"instance_id": task["id"], "problem_statement": task["prompt"], **task["info"]}
    row["FAIL_TO_PASS"] = json.dumps(row["FAIL_TO_PASS"])  # SWE-bench writes the lists as JSON strings
    data = tmp_path / "swe.jsonl"
    data.write_text(json.dumps(row) + "\n")
    results = run(
        RunSettings("byo-swe", data=str(data), paper="swe-verified"), tmp_path / "s", progress=False
    )
    assert results["metrics"]["pass@1"]["value"] == 1.0
    assert results["paper"]["value"] == 73.1


def test_a_scorer_that_raises_grades_that_sample_zero_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    from dsv32.eval.rgym import ReasoningGym

    real = ReasoningGym.score

    def score(self, problem, message):
        if problem.id == "gcd/1":
            raise ValueError("the verifier met something it cannot read")
        return real(self, problem, message)

    monkeypatch.setattr(ReasoningGym, "score", score)
    out = tmp_path / "rg"
    results = run(RunSettings("reasoning-gym", subset=["gcd"], limit=3), out, progress=False)
    rows = {r["id"]: r for r in map(json.loads, (out / "samples.jsonl").read_text().splitlines())}
    assert [rows[f"gcd/{i}"]["score"] for i in range(3)] == [1.0, 0.0, 1.0]
    assert rows["gcd/1"]["reason"].startswith("not scored: the scorer raised ValueError: the verifier met")
    assert results["metrics"]["pass@1"]["value"] == pytest.approx(2 / 3)
    assert "gcd/1" in caplog.text


def _boxed(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return RunSettings("byo-boxed", data=str(path))


def _samples(out):
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def test_lines_added_to_a_file_without_ids_run_only_the_new_problems(tmp_path):
    out, rows = tmp_path / "o", [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": "4"}]
    run(_boxed(tmp_path / "noid.jsonl", rows), out, progress=False)
    first = _samples(out)
    settings = _boxed(tmp_path / "noid.jsonl", [{"problem": "What is 10*10?", "answer": "100"}, *rows])
    results = run(settings, out, progress=False)
    samples = _samples(out)
    assert samples[:2] == first and len(samples) == 3  # the old samples kept, only the new problem asked
    problems = {p.id: p for p in Boxed().problems(data=settings.data)}
    assert sorted(problems) == sorted(r["id"] for r in samples)
    for row in samples:  # each sample was made from the problem it is counted for
        assert row["prompt"] == problems[row["id"]].messages
        assert row["reason"].endswith(f"expected {problems[row['id']].data['answer']!r}")
    assert results["problems"] == 3 and results["metrics"]["pass@1"]["value"] == 1.0


def test_an_edited_problem_is_run_again_and_its_old_samples_count_for_nothing(tmp_path, caplog):
    out = tmp_path / "o"
    rows = [{"id": "x", "problem": "1+1?", "answer": "3"}, {"id": "y", "problem": "2+2?", "answer": "4"}]
    run(_boxed(tmp_path / "ids.jsonl", rows), out, progress=False)
    rows[0]["answer"] = "2"
    results = run(_boxed(tmp_path / "ids.jsonl", rows), out, progress=False)
    assert "1 problem(s) changed since their samples" in caplog.text and "(x)" in caplog.text
    samples = _samples(out)
    assert [(r["id"], r["reason"]) for r in samples] == [
        ("x", "answered '3', expected '3'"),  # kept in the file, no longer counted
        ("y", "answered '4', expected '4'"),
        ("x", "answered '2', expected '2'"),
    ]
    assert results["problems"] == 2 and results["metrics"]["pass@1"]["samples"] == 2
    caplog.clear()
    run(_boxed(tmp_path / "ids.jsonl", rows), out, progress=False)  # nothing left to do
    assert len(_samples(out)) == 3 and "changed" not in caplog.text


def test_samples_without_a_problem_hash_are_made_again(tmp_path):
    out = tmp_path / "o"
    settings = _boxed(tmp_path / "a.jsonl", [{"id": "x", "problem": "1+1?", "answer": "2"}])
    run(settings, out, progress=False)
    [row] = _samples(out)
    del row["problem_hash"]
    (out / "samples.jsonl").write_text(json.dumps(row) + "\n")
    run(settings, out, progress=False)
    assert [("problem_hash" in r) for r in _samples(out)] == [False, True]


class _FailingSolver:
    """The reference answers, except that the ``(id, sample)`` pairs in ``fail`` get no answer, as
    an endpoint call that failed after its retries."""

    chunk_size = 8

    def __init__(self, bench, fail):
        from dsv32.eval.solvers import ReferenceSolver

        self.reference, self.fail = ReferenceSolver(bench), fail

    def complete(self, items, settings):
        out = self.reference.complete(items, settings)
        for (problem, j), gen in zip(items, out):
            if (problem.id, j) in self.fail:
                gen.error = f"HTTP 500 for {problem.id} #{j}"
        return out


def _five(path, n=1):
    rows = [{"id": f"q{i}", "problem": f"{i}+1?", "answer": str(i + 1)} for i in range(5)]
    return replace(_boxed(path, rows), n=n)


def test_failed_samples_mark_the_run_incomplete_and_are_listed(tmp_path):
    out, settings = tmp_path / "o", _five(tmp_path / "f.jsonl")
    solver = _FailingSolver(Boxed(), {("q1", 0), ("q3", 0)})
    with pytest.raises(EvalError) as raised:
        run(settings, out, progress=False, solver=solver)
    message = str(raised.value)
    assert "2 of 5 sample(s) have no scored result (2 of 5 problem(s) none at all)" in message
    assert "q1 #0: HTTP 500 for q1 #0" in message and "q3 #0: HTTP 500 for q3 #0" in message
    results = load_results(out)
    assert results["incomplete"] is True
    assert results["selected"] == {"problems": 5, "samples": 5}
    assert results["problems"] == 3 and results["samples"] == 3
    assert results["missing"] == [
        {"id": "q1", "sample": 0, "error": "HTTP 500 for q1 #0"},
        {"id": "q3", "sample": 0, "error": "HTTP 500 for q3 #0"},
    ]
    assert results["metrics"]["pass@1"]["value"] == 1.0  # a failed sample is not a wrong answer
    report = (out / "report.md").read_text()
    head = report.split("\n")[2]
    assert head.startswith("**INCOMPLETE: 2 of 5 samples have no scored result (2 of 5 problems none at all)")
    assert "3 of 5 problems, 3 of 5 samples scored" in report
    assert "- q3 #0: HTTP 500 for q3 #0" in report
    assert "INCOMPLETE" in side_by_side([out]).splitlines()[0]
    # running again retries just the failed samples and the run is complete
    results = run(settings, out, progress=False, solver=_FailingSolver(Boxed(), set()))
    assert results["incomplete"] is False and results["missing"] == [] and results["problems"] == 5
    assert len(_samples(out)) == 5
    assert "INCOMPLETE" not in (out / "report.md").read_text()


def test_an_incomplete_sampled_run_says_which_pass_at_k_it_lacks(tmp_path):
    out, settings = tmp_path / "o", _five(tmp_path / "f.jsonl", n=4)
    with pytest.raises(EvalError, match=r"1 of 20 sample\(s\) have no scored result \(0 of 5 problem"):
        run(settings, out, progress=False, solver=_FailingSolver(Boxed(), {("q2", 0)}))
    results = load_results(out)
    assert results["incomplete"] and results["missing"][0]["sample"] == 0
    assert "pass@2" in results["metrics"] and "pass@4" not in results["metrics"]
    assert results["problems"] == 5 and results["samples"] == 19
    assert (
        "pass@4 not reported (a problem has fewer scored samples than k)" in (out / "report.md").read_text()
    )


def test_many_failures_are_counted_and_the_rest_pointed_to(tmp_path):
    out, settings = tmp_path / "o", _five(tmp_path / "f.jsonl", n=5)
    fail = {(f"q{i}", j) for i in range(5) for j in range(5)}
    with pytest.raises(EvalError) as raised:
        run(settings, out, progress=False, solver=_FailingSolver(Boxed(), fail))
    lines = str(raised.value).splitlines()
    assert lines[0].startswith("25 of 25 sample(s) have no scored result (5 of 5 problem(s) none at all)")
    assert len(lines) == 1 + 20 + 1 and lines[-1] == "  ... and 5 more (results.json 'missing')"
    results = load_results(out)
    assert len(results["missing"]) == 25 and results["problems"] == 0 and results["metrics"] == {}
    assert "INCOMPLETE: 25 of 25 samples" in (out / "report.md").read_text()


def test_a_second_run_on_a_busy_directory_stops_with_a_typed_error(tmp_path):
    from dsv32.eval import RunDirectoryBusy

    out, settings = tmp_path / "o", _five(tmp_path / "f.jsonl")
    refused = []

    def second(path):  # called while the first run holds the directory
        with pytest.raises(RunDirectoryBusy, match=r"o is in use by another 'dsv32 eval run'") as raised:
            run(settings, path, progress=False)
        refused.append(raised.value.directory)

    results = run(settings, out, progress=False, on_ready=second)
    assert refused == [str(out)]
    assert results["samples"] == 5 and len(_samples(out)) == 5  # nothing written twice
    assert run(settings, out, progress=False)["samples"] == 5  # the lock is gone once the run ends


def test_duplicate_sample_lines_count_once_the_first_kept(tmp_path):
    out, settings = tmp_path / "o", _five(tmp_path / "f.jsonl", n=2)
    run(settings, out, progress=False)
    lines = (out / "samples.jsonl").read_text().splitlines()
    wrong = [json.dumps({**json.loads(line), "score": 0.0}) for line in lines]
    (out / "samples.jsonl").write_text("\n".join(lines + wrong) + "\n")  # as two runs at once leave it
    results = run(settings, out, progress=False)
    assert len(_samples(out)) == 20  # nothing ran again
    assert results["problems"] == 5 and results["samples"] == 10
    assert results["metrics"]["pass@1"]["value"] == 1.0 and results["metrics"]["pass@1"]["samples"] == 10
    assert results["metrics"]["pass@2"]["value"] == 1.0 and not results["incomplete"]


def _rg(tmp_path, name, **settings):
    run(
        RunSettings("reasoning-gym", **{"subset": ["gcd"], "limit": 2, **settings}),
        tmp_path / name,
        progress=False,
    )
    return tmp_path / name


def _warning(table):
    [line] = [line for line in table.splitlines() if line.startswith("WARNING")]
    return line


def test_side_by_side_shows_what_makes_runs_comparable_and_warns_when_they_differ(tmp_path):
    a, b = _rg(tmp_path, "a"), _rg(tmp_path, "b", limit=3)
    table = side_by_side([a, b])
    assert "| reasoning-gym | problems | 2 | 3 |" in table
    settings = next(line for line in table.splitlines() if "| settings |" in line)
    assert "subset=gcd, limit=2, data=-, n=1, temperature=1.0" in settings and "limit=3" in settings
    warning = _warning(table)
    assert warning.startswith("WARNING: reasoning-gym: these runs are not comparable")
    assert "problems 2 vs 3" in warning and "limit 2 vs 3" in warning and "problem set" in warning
    assert "temperature" not in warning and "subset" not in warning
    assert "WARNING" not in side_by_side([a, _rg(tmp_path, "same")])  # the same settings elsewhere


def test_the_same_count_of_other_problems_is_not_comparable(tmp_path):
    warning = _warning(side_by_side([_rg(tmp_path, "a"), _rg(tmp_path, "b", subset=["lcm"])]))
    assert "problem set " in warning and "subset gcd vs lcm" in warning and "problems 2 vs" not in warning


def test_other_sampling_data_or_an_incomplete_run_is_warned_of(tmp_path):
    warning = _warning(side_by_side([_rg(tmp_path, "a"), _rg(tmp_path, "b", n=2, temperature=0.5)]))
    assert "n 1 vs 2" in warning and "temperature 1.0 vs 0.5" in warning and "problem set" not in warning
    one, two = _five(tmp_path / "one.jsonl"), _five(tmp_path / "two.jsonl")
    run(one, tmp_path / "c", progress=False)
    run(two, tmp_path / "d", progress=False)
    warning = _warning(side_by_side([tmp_path / "c", tmp_path / "d"]))
    assert f"data {tmp_path / 'one.jsonl'} vs {tmp_path / 'two.jsonl'}" in warning
    with pytest.raises(EvalError):
        run(one, tmp_path / "e", progress=False, solver=_FailingSolver(Boxed(), {("q0", 0)}))
    table = side_by_side([tmp_path / "c", tmp_path / "e"])
    assert "| byo-boxed | problems | 5 | 4 of 5 scored (INCOMPLETE) |" in table
    assert "incomplete no vs yes" in _warning(table)


def test_the_report_counts_how_replies_ended(tmp_path):
    out, settings = tmp_path / "o", _five(tmp_path / "f.jsonl")
    solver = _FailingSolver(Boxed(), set())
    reference = solver.complete

    def complete(items, settings):
        out = reference(items, settings)
        for (problem, _), gen in zip(items, out):
            if problem.id in ("q1", "q4"):
                gen.finish_reason = "length"
        return out

    solver.complete = complete
    results = run(settings, out, progress=False, solver=solver)
    assert results["endings"] == {"length": 2, "stop": 3}
    assert "- replies ended: length: 2 (cut at max_tokens), stop: 3" in (out / "report.md").read_text()
    episodes = run(RunSettings("agent-code-interpreter", limit=2), tmp_path / "e", progress=False)
    assert episodes["endings"] == {"answer": 2}
    assert "- episodes ended: answer: 2" in (tmp_path / "e" / "report.md").read_text()


@pytest.mark.parametrize(("backend", "temperature"), [("openai", 0.0), ("local", 0.0), ("local", 1e-6)])
def test_several_samples_at_a_greedy_temperature_are_refused(backend, temperature):
    with pytest.raises(EvalError, match=r"gives the same completion 4 times"):
        RunSettings("humaneval", backend=backend, temperature=temperature, n=4)


def test_a_tiny_temperature_is_sampling_for_an_endpoint_and_at_the_local_threshold():
    assert RunSettings("humaneval", backend="openai", temperature=1e-6, n=4).n == 4  # the server decides
    assert RunSettings("humaneval", backend="local", temperature=1e-5, n=4).n == 4


def test_rescore_grades_the_kept_completions_again_and_records_it(tmp_path):
    out = tmp_path / "he"
    first = run(RunSettings("humaneval", limit=3), out, progress=False)
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    # as an older scorer might have left them: one right program graded 0, one wrong program graded 1
    rows[0]["score"], rows[0]["reason"] = 0.0, "graded by an older rule"
    broken = "```python\ndef something_else():\n    return None\n```"
    rows[1]["completion"] = {**rows[1]["completion"], "content": broken}
    (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    stale = {**json.loads((out / "results.json").read_text()), "metrics": {"pass@1": {"value": 2 / 3}}}
    (out / "results.json").write_text(json.dumps(stale))

    results = rescore(out)

    again = {r["id"]: r for r in map(json.loads, (out / "samples.jsonl").read_text().splitlines())}
    assert (
        again[rows[0]["id"]]["score"] == 1.0 and again[rows[0]["id"]]["reason"] != "graded by an older rule"
    )
    assert again[rows[1]["id"]]["score"] == 0.0 and again[rows[1]["id"]]["completion"]["content"] == broken
    assert again[rows[2]["id"]]["score"] == 1.0
    assert results["metrics"]["pass@1"]["value"] == pytest.approx(2 / 3)
    assert results["rescored"]["changed"] == 2 and results["rescored"]["samples"] == 3
    assert results["rescored"]["before"] == pytest.approx(2 / 3)
    # the samples' making is kept: its date, commit and wall time
    assert (results["date"], results["git_commit"]) == (first["date"], first["git_commit"])
    assert results["elapsed_s"] == first["elapsed_s"]
    assert load_results(out)["rescored"] == results["rescored"]
    assert "graded again" in (out / "report.md").read_text()


def test_rescore_from_the_command_line(tmp_path, capsys):
    from dsv32.cli import main

    out = tmp_path / "rg"
    run(RunSettings("reasoning-gym", subset=["gcd"], limit=4), out, progress=False)
    assert main(["eval", "rescore", str(out)]) == 0
    line = capsys.readouterr().out
    assert (
        line.startswith("reasoning-gym reference: pass@1 100.0% [")
        and "0 of 4 sample score(s) changed" in line
    )


def test_rescore_refuses_episodes_and_directories_without_a_run(tmp_path):
    with pytest.raises(EvalError, match=r"no results\.json"):
        rescore(tmp_path / "nothing")
    out = tmp_path / "agent"
    run(RunSettings("agent-search", subset=["stdlib"], limit=1), out, progress=False)
    with pytest.raises(EvalError, match="environment's state"):
        rescore(out)
    (out / "results.json").write_text(json.dumps({"metrics": {}}))
    with pytest.raises(EvalError, match="no run settings"):
        rescore(out)
