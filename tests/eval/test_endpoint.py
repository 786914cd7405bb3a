"""``--backend openai`` against a scripted OpenAI-compatible endpoint on loopback, through the CLI:
concurrency, the paper's default request settings, tool calls, multi-turn episodes, failed requests
retried by running the command again."""

from __future__ import annotations

import json

import pytest
from eval_stub import StubEndpoint

from dsv32.cli import main
from dsv32.eval.bfcl.multi_turn import BFCLMultiTurn
from dsv32.eval.bfcl.single import BFCL
from dsv32.eval.humaneval import HumanEval


def _user_text(request: dict) -> str:
    return next(m["content"] for m in request["messages"] if m["role"] == "user")


@pytest.fixture(scope="module")
def humaneval():
    bench = HumanEval()
    return bench, {p.messages[0]["content"]: p for p in bench.problems()[:4]}


def test_humaneval_over_an_endpoint(tmp_path, humaneval, capsys):
    bench, by_prompt = humaneval
    order = list(by_prompt)

    def reply(request):
        problem = by_prompt[_user_text(request)]
        if order.index(_user_text(request)) % 2:  # odd problems get a wrong function
            return {"content": f"```python\n{problem.data['prompt']}    return None\n```"}
        return bench.reference(problem)

    out = tmp_path / "run"
    with StubEndpoint(reply) as stub:
        code = main(["eval", "run", "humaneval", "--backend", "openai", "--base-url", stub.base_url, "--model",
                     "stub-model", "--limit", "4", "--n", "3", "--concurrency", "3", "--out", str(out), "--no-progress"])  # fmt: skip
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["metrics"]["pass@1"]["value"] == pytest.approx(0.5)
    assert results["metrics"]["pass@2"]["value"] == pytest.approx(0.5)
    assert results["model"] == {"backend": "openai", "name": "stub-model", "base_url": stub.base_url}
    assert len(stub.requests) == 12
    first = stub.requests[0]
    assert first["temperature"] == 1.0 and first["top_p"] == 1.0 and first["max_tokens"] == 131072
    assert first["chat_template_kwargs"] == {"thinking": True}
    assert "pass@1 50.0%" in capsys.readouterr().out


def test_failed_requests_are_retried_by_running_again(tmp_path, humaneval, capsys):
    bench, by_prompt = humaneval
    failing = {list(by_prompt)[1]}

    def reply(request):
        if _user_text(request) in failing:
            return 400
        return bench.reference(by_prompt[_user_text(request)])

    out = tmp_path / "run"
    argv = ["eval", "run", "humaneval", "--backend", "openai", "--model", "m", "--limit", "3", "--out", str(out),
            "--no-progress", "--no-thinking"]  # fmt: skip
    with StubEndpoint(reply) as stub:
        assert main([*argv, "--base-url", stub.base_url]) == 2  # one sample got no answer
        assert len((out / "samples.jsonl").read_text().splitlines()) == 2
        err = capsys.readouterr().err
        assert "1 of 3 sample(s) have no scored result" in err and "HumanEval/1 #0: " in err
        partial = json.loads((out / "results.json").read_text())
        assert partial["incomplete"] and [(m["id"], m["sample"]) for m in partial["missing"]] == [
            ("HumanEval/1", 0)
        ]
        assert "400" in partial["missing"][0]["error"]
        assert (out / "report.md").read_text().splitlines()[2].startswith("**INCOMPLETE: 1 of 3 samples")
        assert stub.requests[0]["chat_template_kwargs"] == {"thinking": False}
        failing.clear()
        seen = len(stub.requests)
        assert main([*argv, "--base-url", stub.base_url]) == 0
        assert len(stub.requests) == seen + 1  # only the missing sample was asked again
    final = json.loads((out / "results.json").read_text())
    assert final["metrics"]["pass@1"]["value"] == 1.0 and not final["incomplete"] and final["missing"] == []


def test_bfcl_tool_calls_over_an_endpoint(tmp_path):
    bench = BFCL()
    problems = {json.dumps(p.messages): p for p in bench.problems(["simple_python", "parallel"])}

    def reply(request):
        messages = [{k: m[k] for k in ("role", "content")} for m in request["messages"]]
        problem = problems[json.dumps(messages)]
        assert request["tools"] == problem.tools
        return bench.reference(problem)

    out = tmp_path / "b"
    with StubEndpoint(reply) as stub:
        assert main(["eval", "run", "bfcl", "--subset", "simple_python,parallel", "--limit", "5", "--backend", "openai",
                     "--base-url", stub.base_url, "--model", "m", "--concurrency", "2", "--out", str(out), "--no-progress"]) == 0  # fmt: skip
    assert json.loads((out / "results.json").read_text())["metrics"]["pass@1"]["value"] == 1.0


def test_bfcl_multi_turn_episodes_over_an_endpoint(tmp_path, monkeypatch):
    import openai

    made = []
    real = openai.OpenAI.__init__
    monkeypatch.setattr(
        openai.OpenAI, "__init__", lambda self, *a, **k: made.append(1) or real(self, *a, **k)
    )
    bench = BFCLMultiTurn()
    problems = {p.messages[0]["content"]: p for p in bench.problems(["multi_turn_base"])[:2]}
    replies = {text: bench.reference_replies(p) for text, p in problems.items()}

    def reply(request):
        done = sum(m["role"] == "assistant" for m in request["messages"])
        return replies[_user_text(request)][done]

    out = tmp_path / "mt"
    with StubEndpoint(reply) as stub:
        assert main(["eval", "run", "bfcl-multi-turn", "--subset", "multi_turn_base", "--limit", "2", "--backend",
                     "openai", "--base-url", stub.base_url, "--model", "m", "--concurrency", "2", "--out", str(out),
                     "--no-progress"]) == 0  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    assert results["metrics"]["pass@1"]["value"] == 1.0
    assert results["agentic"]["steps_mean"] > 2
    assert any(m["role"] == "tool" for m in stub.requests[-1]["messages"])
    assert len(made) == 1  # one HTTP client serves every episode's backend


def test_unreadable_tool_call_arguments_score_zero_and_the_run_finishes(tmp_path):
    bench = BFCL()
    problems = {json.dumps(p.messages): p for p in bench.problems(["simple_python"])[:3]}
    hostile = ['{"a": ' + "1" * 5000 + "}", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"]

    def reply(request):
        messages = [{k: m[k] for k in ("role", "content")} for m in request["messages"]]
        index = list(problems).index(json.dumps(messages))
        message = bench.reference(problems[json.dumps(messages)])
        if index < len(hostile):
            message["tool_calls"][0]["function"]["arguments"] = hostile[index]
        return message

    out = tmp_path / "b"
    with StubEndpoint(reply) as stub:
        assert main(["eval", "run", "bfcl", "--subset", "simple_python", "--limit", "3", "--backend", "openai",
                     "--base-url", stub.base_url, "--model", "m", "--out", str(out), "--no-progress"]) == 0  # fmt: skip
    rows = {r["id"]: r for r in map(json.loads, (out / "samples.jsonl").read_text().splitlines())}
    assert sorted(r["score"] for r in rows.values()) == [0.0, 0.0, 1.0]
    reasons = " ".join(r["reason"] for r in rows.values())
    assert "cannot be read (ValueError)" in reasons and "cannot be read (RecursionError)" in reasons


def test_failed_episodes_are_listed_as_missing(tmp_path, capsys):
    out = tmp_path / "ci"
    with StubEndpoint(lambda request: 400) as stub:
        assert main(["eval", "run", "agent-code-interpreter", "--limit", "2", "--backend", "openai", "--base-url",
                     stub.base_url, "--model", "m", "--concurrency", "2", "--out", str(out), "--no-progress"]) == 2  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    assert results["incomplete"] and results["problems"] == 0 and len(results["missing"]) == 2
    assert all(m["error"] for m in results["missing"])
    assert "2 of 2 sample(s) have no scored result" in capsys.readouterr().err


def test_a_hung_endpoint_holds_a_sample_only_for_the_timeout_and_retries_given(tmp_path, humaneval, capsys):
    import threading

    bench, by_prompt = humaneval
    hung, release = list(by_prompt)[1], threading.Event()

    def reply(request):
        if _user_text(request) == hung:
            release.wait(30)  # never answers in time
        return bench.reference(by_prompt[_user_text(request)])

    out = tmp_path / "run"
    with StubEndpoint(reply) as stub:
        argv = ["eval", "run", "humaneval", "--backend", "openai", "--base-url", stub.base_url, "--model", "m",
                "--limit", "2", "--out", str(out), "--no-progress", "--timeout", "0.5", "--max-retries", "1"]  # fmt: skip
        try:
            assert main(argv) == 2
        finally:
            release.set()
    assert sum(_user_text(r) == hung for r in stub.requests) == 2  # the first attempt and one retry
    (missing,) = json.loads((out / "results.json").read_text())["missing"]
    assert missing["id"] == "HumanEval/1" and "timed out" in missing["error"].lower()
    assert "after up to 1 retries" in missing["error"]
