"""``dsv32 view``: the pages of an evaluation run, a post-training run and episodes — every string a
run wrote shown as text — and, in headless Chromium, each page loading offline without a console
error, drawing something, filtering its samples on a click, and never running a planted script."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.browser import Browser, colours, skip_without_chromium

from dsv32.agent.trajectory import Step, ToolRecord, Trajectory
from dsv32.cli import main
from dsv32.view import ViewError, render, write_view
from dsv32.view.page import json_script

HOSTILE = '<script>document.title="pwned";window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
TITLE_OF = {"eval": "evaluation: agent-code-interpreter", "posttrain": "post-training run"}


def hostile_trajectory() -> Trajectory:
    """A trajectory whose every string is markup: task, reasoning, tool name and arguments, result, answer."""
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": f"py{HOSTILE}", "arguments": json.dumps({"code": HOSTILE})},
    }
    messages = [
        {"role": "system", "content": f"system {HOSTILE}"},
        {"role": "user", "content": f"What is 6*7? {HOSTILE}"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": f"</pre></details>{HOSTILE}",
            "tool_calls": [call],
        },
        {"role": "tool", "tool_call_id": "c1", "content": HOSTILE},
        {"role": "assistant", "content": f"\\boxed{{42}} {HOSTILE}", "reasoning_content": "done"},
    ]
    steps = [
        Step(index=0, prompt_tokens=50, completion_tokens=20, finish_reason="tool_calls",
             tool_calls=[ToolRecord(f"py{HOSTILE}", "c1", True)]),
        Step(index=1, prompt_tokens=90, completion_tokens=8, finish_reason="stop"),
    ]  # fmt: skip
    return Trajectory(messages, final=f"\\boxed{{42}}{HOSTILE}", steps=steps, stop_reason=HOSTILE,
                      total_steps=2, total_tokens=168)  # fmt: skip


def assert_inert(html: str) -> None:
    """Exactly the page's two script elements (its JSON and its code), no image but the run's own
    figures, and the planted markup as text."""
    assert html.count("<script") == 2
    assert html.count("<img") == len(
        re.findall(r'<img alt="[^"<>]*" src="data:image/png;base64,[A-Za-z0-9+/=]+">', html)
    )
    assert "&lt;script&gt;document.title=&quot;pwned&quot;" in html


# --------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def eval_run(tmp_path_factory) -> Path:
    """A real reference run of the agentic code-interpreter benchmark, one of its samples then made a
    failure whose tool result and verifier reason are markup."""
    from dsv32.eval.runner import run
    from dsv32.eval.settings import RunSettings

    out = tmp_path_factory.mktemp("eval") / "run"
    run(RunSettings("agent-code-interpreter", subset=["smoke"], limit=3), out, progress=False)
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) >= 2 and all(r["score"] == 1.0 for r in rows)
    failed = rows[1]
    failed["score"], failed["reason"] = 0.0, f"boxed '41' differs {HOSTILE}"
    for message in failed["messages"]:
        if message["role"] == "tool":
            message["content"] = HOSTILE
    (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


@pytest.fixture(scope="module")
def posttrain_run(tmp_path_factory) -> Path:
    """A post-training run directory as the proof writes it: tasks, per-stage evaluations with sample
    conversations, the SFT and GRPO logs and the report (written by the proof's own report writer)."""
    from dsv32.envs.base import save_tasks
    from dsv32.envs.interpreter import generate
    from dsv32.posttrain.report import report_dict, write_report

    root = tmp_path_factory.mktemp("posttrain") / "run"
    held = generate(4, seed=1, prefix="heldout")
    held[0].prompt += HOSTILE
    save_tasks(held, root / "tasks_heldout.jsonl")
    solved = {"base": {0}, "sft": {0, 1}, "rl": {0, 1, 2}}
    evals = {}
    for stage, ok in solved.items():
        outcomes = [{"id": t.id, "correct": i in ok, "tool_call_valid": True, "used_tool": True, "steps": 2,
                     "tokens": 40, "stop": "answer"} for i, t in enumerate(held)]  # fmt: skip
        evals[stage] = {"episodes": 4, "accuracy": len(ok) / 4, "tool_call_valid": 1.0, "used_tool": 1.0,
                        "mean_steps": 2.0, "outcomes": outcomes,
                        "samples": [hostile_trajectory().messages[1:]]}  # fmt: skip
        (root / f"eval_{stage}.json").write_text(json.dumps(evals[stage]))
    (root / "sft").mkdir()
    (root / "rl").mkdir()
    sft = [
        {"step": s, "loss": 2.0 / s, **({"eval_loss": 2.5 / s} if s % 2 == 0 else {})} for s in range(1, 9)
    ]
    rl = [{"step": s, "reward_mean": 0.1 * s, "accuracy": 0.1 * s, "kl": 1e-3 * s} for s in range(1, 5)]
    held_curve = [{"step": s, "accuracy": 0.25 * (s // 2 + 1), "episodes": 4} for s in (0, 2, 4)]
    for path, rows in (
        (root / "sft/metrics.jsonl", sft),
        (root / "rl/metrics.jsonl", rl),
        (root / "rl/eval.jsonl", held_curve),
    ):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    machine = {"cpus": 2, "torch_threads": 2, "load_average_1_5_15": [1, 1, 1]}
    details = {"evals": evals, "machine": machine, "model": "tiny-llama", "task": "code-interpreter",
               "load_start": [1, 1, 1], "stage_minutes": {}, "command": "dsv32 posttrain proof",
               "cold_start": {"kept": 2, "tasks": 2}}  # fmt: skip
    write_report(root, report_dict(evals, 4, 1.5, details), sft, rl)
    return root


@pytest.fixture(scope="module")
def chromium():
    skip_without_chromium()
    browser = Browser()
    yield browser
    browser.close()


# --------------------------------------------------------------------------------------- the pages
def test_every_string_of_an_episode_is_text(tmp_path):
    hostile_trajectory().save(tmp_path / "t.json")
    html = render(tmp_path / "t.json")
    assert_inert(html)
    assert "reasoning · " in html and "<details><summary>reasoning" in html  # collapsed
    assert "50 prompt + 20 completion tokens · finish: tool_calls" in html
    assert "final answer" in html and "stop: &lt;script&gt;" in html


def test_embedded_json_cannot_close_its_element():
    text = json_script("d", {"x": "</script><script>alert(1)</script>&\u2028"})
    inner = text[text.index(">") + 1 : text.rindex("</script>")]
    assert "<" not in inner and ">" not in inner and "&" not in inner
    assert json.loads(inner) == {"x": "</script><script>alert(1)</script>&\u2028"}


def test_an_eval_run_page_lists_every_sample(eval_run):
    html = render(eval_run)
    rows = (eval_run / "samples.jsonl").read_text().splitlines()
    assert html.count('<tr class="sample"') == len(rows) and html.count('data-passed="0"') == 1
    assert_inert(html)
    assert "pass@1" in html and "agent-code-interpreter" in html


def test_a_posttrain_page_sets_the_stages_side_by_side(posttrain_run):
    html = render(posttrain_run)
    assert_inert(html)
    assert html.count('<tr class="sample"') == 4 and html.count("not solved") == 3 + 2 + 1
    assert html.count("data:image/png;base64,") == 1  # report.png (the writer draws no stage plots)
    assert html.count('<svg class="chart"') == 5  # SFT loss, GRPO reward, accuracy, KL, held-out
    assert "accuracy · agentic GRPO" in html


def test_an_envs_run_directory_shows_rewards_and_reasons(tmp_path):
    hostile_trajectory().save(tmp_path / "trajectories" / "t-1.json")
    Trajectory([{"role": "user", "content": "hi"}], final="no").save(tmp_path / "trajectories" / "t-2.json")
    results = [
        {"id": "t-1", "reward": 1.0, "reason": "answer 42 is right"},
        {"id": "t-2", "reward": 0.0, "reason": "wrong"},
    ]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    html = render(tmp_path)
    assert "verifier: answer 42 is right" in html and html.count('<tr class="sample"') == 2
    assert 'data-passed="1"' in html and 'data-passed="0"' in html
    one = render(tmp_path / "trajectories" / "t-1.json")
    assert "verifier: answer 42 is right" in one and "score 1.000" in one


def test_jsonl_of_samples_or_conversations(tmp_path, eval_run):
    assert render(eval_run / "samples.jsonl").count('<tr class="sample"') >= 2
    convo = tmp_path / "c.jsonl"
    convo.write_text(
        json.dumps(hostile_trajectory().messages) + "\n" + json.dumps(hostile_trajectory().to_dict()) + "\n"
    )
    assert_inert(render(convo))


def test_the_command_writes_the_page_and_names_what_it_cannot_show(tmp_path, capsys, eval_run):
    out = tmp_path / "page" / "eval.html"
    assert main(["view", str(eval_run), "--out", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>") and str(out) in capsys.readouterr().out
    assert main(["view", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["view", str(tmp_path / "empty"), "--out", str(out)]) == 2
    assert "not a run directory dsv32 view knows" in capsys.readouterr().err
    (tmp_path / "x.json").write_text('{"a": 1}')
    with pytest.raises(ViewError, match="not an episode"):
        write_view(tmp_path / "x.json", out)


# --------------------------------------------------------------------------------------- in Chromium
def _visible(page, selector: str) -> list[str]:
    return page.evaluate(
        f"Array.from(document.querySelectorAll({json.dumps(selector)}))"
        ".filter(e => e.offsetParent !== null).map(e => e.dataset.passed)"
    )


def _loaded_cleanly(page, html: Path, title: str) -> None:
    page.open(html)
    assert page.problems() == []
    fetched = [url for url in page.requests() if not url.startswith("data:")]
    assert fetched == [html.absolute().as_uri()]  # nothing but the file itself and its data: figures
    assert page.evaluate("document.title") == title
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert colours(page.screenshot()) > 16  # not blank


def test_the_eval_page_in_chromium(chromium, eval_run, tmp_path):
    html = write_view(eval_run, tmp_path / "eval.html")
    page = chromium.page()
    _loaded_cleanly(page, html, TITLE_OF["eval"])
    rows = len((eval_run / "samples.jsonl").read_text().splitlines())
    assert sorted(_visible(page, "tr.sample")) == ["0"] + ["1"] * (rows - 1)
    page.click('button[data-mode="failed"]')
    assert _visible(page, "tr.sample") == ["0"]
    assert page.evaluate("document.querySelector('.count').textContent") == f"1 of {rows} shown"
    page.click('button[data-mode="passed"]')
    assert _visible(page, "tr.sample") == ["1"] * (rows - 1)
    page.click('button[data-mode="all"]')
    page.click("input[type=search]")
    page.send("Input.insertText", {"text": "differs"})  # the failed sample's reason
    assert _visible(page, "tr.sample") == ["0"]
    page.click("tr.sample:not(.hidden)")  # opens its trajectory
    detail = page.evaluate(
        "document.querySelector('tr.sample[data-passed=\"0\"]').nextElementSibling.innerText"
    )
    assert 'document.title="pwned"' in detail and "TOOL RESULT" in detail.upper()
    assert page.evaluate("typeof window.__pwned") == "undefined" and page.problems() == []
    assert page.evaluate("window.dsv32.samples.length") == rows


def test_the_posttrain_page_in_chromium(chromium, posttrain_run, tmp_path):
    html = write_view(posttrain_run, tmp_path / "posttrain.html")
    page = chromium.page()
    _loaded_cleanly(page, html, TITLE_OF["posttrain"])
    assert page.evaluate("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
    assert page.evaluate("document.querySelectorAll('svg.chart polyline').length") >= 4
    page.click('button[data-mode="failed"]')  # not solved after GRPO: the last task only
    assert _visible(page, "tr.sample") == ["0"]


def test_an_episode_page_in_chromium(chromium, tmp_path):
    hostile_trajectory().save(tmp_path / "t.json")
    html = write_view(tmp_path / "t.json", tmp_path / "t.html")
    page = chromium.page()
    _loaded_cleanly(page, html, "episode t")
    assert page.evaluate("document.querySelector('.turn.assistant details').open") is False
    page.click(".turn.assistant details summary")
    assert page.evaluate("document.querySelector('.turn.assistant details').open") is True
    text = page.evaluate("document.body.innerText")
    assert re.search(r"<script>document\.title=\"pwned\"", text) and page.problems() == []
