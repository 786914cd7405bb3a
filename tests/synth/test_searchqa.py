"""The search-QA pipeline with scripted agents over a small corpus: it keeps a task only when the
ground truth is verified and every candidate is verifiably wrong, and drops the others for the
right reason (and without spending later stages)."""

from __future__ import annotations

import json
import re

import pytest

from dsv32.agent import ScriptedBackend
from dsv32.envs.base import load_tasks
from dsv32.envs.search import SearchEnv, shared_index
from dsv32.synth.backends import BackendSpec
from dsv32.synth.records import JobFailed, SynthError
from dsv32.synth.roles import AgentSpec
from dsv32.synth.rubric import check_rubric, grading_messages, rubric_score
from dsv32.synth.searchqa import SearchQAConfig, sample_entities, synthesize_qa

DOCS = [
    (
        "quokka.Burrow",
        "quokka.Burrow",
        "class quokka.Burrow(depth=3)\nA burrow. Its keeper is quokka.Warden.",
    ),
    (
        "quokka.Warden",
        "quokka.Warden",
        "class quokka.Warden(shift='night')\nGuards burrows. Default shift is 'night'.",
    ),
    ("quokka.Meadow", "quokka.Meadow", "class quokka.Meadow(size=10)\nOpen ground near a burrow."),
    ("wombat.Den", "wombat.Den", "class wombat.Den(rooms=2)\nA den with rooms."),
    ("wombat.Tunnel", "wombat.Tunnel", "class wombat.Tunnel(length=40)\nConnects a den to a burrow."),
]
QUESTION = "What is the default shift of the class that keeps a quokka.Burrow?"
GOLD = "'night'"


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": i, "title": t, "text": x}) + "\n" for i, t, x in DOCS))
    return str(path)


def _call(name: str, **arguments) -> dict:
    return {"reasoning_content": "next step", "tool_calls": [{"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}  # fmt: skip


def _constructor() -> AgentSpec:
    return AgentSpec("constructor", ScriptedBackend([
        _call("search", query="quokka Burrow"),
        _call("open", doc_id="quokka.Burrow"),
        _call("search", query="quokka Warden shift"),
        _call("submit_qa", question=QUESTION, answer=GOLD, evidence=["quokka.Warden"]),  # misses the entity
        _call("submit_qa", question=QUESTION, answer=GOLD, evidence=["quokka.Burrow", "quokka.Warden"]),
        {"content": "Submitted."},
    ]))  # fmt: skip


def _answerer(name: str, final: str) -> AgentSpec:
    return AgentSpec(name, ScriptedBackend([_call("search", query="quokka burrow"), {"content": final}]),
                     system="Answer briefly. End with `Answer: <answer>`.")  # fmt: skip


def _judge(correct: dict[str, bool]):
    """A verifier reply that reads the listed answers and judges each by its text."""

    def reply(messages, tools):
        task = next(m["content"] for m in messages if m["role"] == "user")
        listed = re.findall(r"^\[(\d+)\] (.*)$", task, re.MULTILINE)
        verdicts = [{"index": int(i), "correct": correct[a], "reason": "checked"} for i, a in listed]
        return _call("submit_verdict", verdicts=verdicts)

    return reply


def _verifier(*passes: dict[str, bool]) -> AgentSpec:
    replies = []
    for judged in passes:
        replies += [_call("open", doc_id="quokka.Warden"), _judge(judged), {"content": "done"}]
    return AgentSpec("verifier", ScriptedBackend(replies))


RUBRIC = {"criteria": [
    {"name": "correct", "description": "The final answer is 'night'.", "weight": 3},
    {"name": "evidence", "description": "Cites quokka.Warden.", "weight": 1},
]}  # fmt: skip


def _rubric_writer(text: str | None = None) -> AgentSpec:
    return AgentSpec("rubric", ScriptedBackend([{"content": text or f"```json\n{json.dumps(RUBRIC)}\n```"}]))


def _run(corpus, answerers, verifier, rubric=None, passes=2):
    entity = shared_index(corpus).by_id["quokka.Burrow"]
    config = SearchQAConfig(depth=2, verify_passes=passes, corpus=corpus)
    return synthesize_qa(entity, "q0", constructor=_constructor(), answerers=answerers, verifier=verifier,
                         rubric_writer=rubric or _rubric_writer(), config=config)  # fmt: skip


def test_a_verified_hard_question_is_kept_with_its_rubric(corpus, tmp_path):
    wrong = {GOLD: True, "'day'": False, "3": False}
    result = _run(
        corpus, [_answerer("a", "Answer: 'day'"), _answerer("b", "Answer: 3")], _verifier(wrong, wrong)
    )
    assert result.dropped == [] and len(result.items) == 1
    row = result.items[0].task
    assert row["prompt"] == QUESTION and row["answer"] == GOLD
    assert row["info"]["evidence"] == ["quokka.Burrow", "quokka.Warden"]
    assert [c["answer"] for c in row["info"]["candidates"]] == ["'day'", "3"]
    assert row["info"]["rubric"]["criteria"][0]["weight"] == 0.75
    assert result.stats["verdicts"] == [[True, False, False], [True, False, False]]
    assert set(result.usage.roles) == {"constructor", "answerer:a", "answerer:b", "verifier", "rubric"}
    # the kept row is a search task: it loads and the search environment scores its ground truth 1
    path = tmp_path / "kept.jsonl"
    path.write_text(json.dumps(row) + "\n")
    task = load_tasks(path)[0]
    with SearchEnv(corpus) as env:
        env.reset(task)
        assert env.reward(type("T", (), {"messages": [], "final": "Answer: 'night'"})()).value == 1.0


def test_the_constructor_is_told_what_is_wrong_with_a_submission(corpus):
    constructor = _constructor()
    entity = shared_index(corpus).by_id["quokka.Burrow"]
    config = SearchQAConfig(depth=2, verify_passes=1, corpus=corpus)
    wrong = {GOLD: True, "3": False}
    synthesize_qa(entity, "q0", constructor=constructor, answerers=[_answerer("b", "Answer: 3")],
                  verifier=_verifier(wrong), rubric_writer=_rubric_writer(), config=config)  # fmt: skip
    tool_texts = [m["content"] for m in constructor.backend.calls[-1].messages if m["role"] == "tool"]
    assert "the evidence must include the entity's document 'quokka.Burrow'" in tool_texts[3]
    assert tool_texts[4] == "accepted"


def test_an_answer_agent_that_finds_the_truth_drops_the_task_before_verification(corpus):
    verifier = _verifier({})
    result = _run(corpus, [_answerer("a", "Answer: 'day'"), _answerer("b", "Answer: 'night'")], verifier)
    assert result.items == [] and result.dropped == [
        {"reason": "an answer agent found the ground truth", "agent": "b"}
    ]
    assert verifier.backend.calls == []


@pytest.mark.parametrize(
    ("second_pass", "reason"),
    [({GOLD: True, "'day'": True}, "a candidate was judged correct"),
     ({GOLD: False, "'day'": False}, "the ground truth was not verified")],
)  # fmt: skip
def test_every_pass_must_confirm_the_truth_and_reject_every_candidate(corpus, second_pass, reason):
    first = {GOLD: True, "'day'": False}
    result = _run(corpus, [_answerer("a", "Answer: 'day'")], _verifier(first, second_pass))
    assert result.items == [] and result.dropped[0]["reason"] == reason


def test_no_verdict_and_a_malformed_rubric_are_drops(corpus):
    silent = AgentSpec("verifier", ScriptedBackend([{"content": "I think it is fine."}]))
    result = _run(corpus, [_answerer("a", "Answer: 'day'")], silent)
    assert result.dropped[0]["reason"] == "the verifier gave no verdict"
    wrong = {GOLD: True, "'day'": False}
    bad = AgentSpec("rubric", ScriptedBackend([{"content": "not json"}, {"content": '{"criteria": []}'}]))
    result = _run(corpus, [_answerer("a", "Answer: 'day'")], _verifier(wrong), rubric=bad, passes=1)
    assert result.dropped[0] == {
        "reason": "the rubric is malformed",
        "detail": "a rubric needs 2 to 8 criteria, got 0",
    }


def test_long_tail_entities(corpus):
    index = shared_index(corpus)
    # "burrow" is named by 3 documents, "warden" and "den" by 2, "meadow" and "tunnel" by their own only
    assert {d.id for d in sample_entities(index, 2, seed=0, max_mentions=1)} == {
        "quokka.Meadow",
        "wombat.Tunnel",
    }
    picked = sample_entities(index, 4, seed=3, max_mentions=2)
    assert {d.id for d in picked} == {"quokka.Warden", "quokka.Meadow", "wombat.Den", "wombat.Tunnel"}
    assert picked == sample_entities(index, 4, seed=3, max_mentions=2)
    with pytest.raises(SynthError, match="long-tail documents"):
        sample_entities(index, 5, max_mentions=2)


def test_rubric_checks_and_scoring():
    rubric = check_rubric(RUBRIC)
    assert [c["weight"] for c in rubric["criteria"]] == [0.75, 0.25]
    assert rubric_score(rubric, '{"scores": {"correct": 1, "evidence": 0.5}}') == pytest.approx(0.875)
    with pytest.raises(SynthError, match="no score in"):
        rubric_score(rubric, '{"scores": {"correct": 2}}')
    assert "weight must be a number > 0" in check_rubric(
        {"criteria": [RUBRIC["criteria"][0], {"name": "x", "description": "y", "weight": 0}]}
    )
    assert "Rubric:" in grading_messages(rubric, "q", "r")[1]["content"]


def _dead(name: str) -> AgentSpec:
    return AgentSpec(name, ScriptedBackend([]))  # every call fails


def test_an_agent_whose_endpoint_fails_makes_the_job_an_error_not_a_drop(corpus, monkeypatch):
    entity = shared_index(corpus).by_id["quokka.Burrow"]
    config = SearchQAConfig(depth=2, verify_passes=1, corpus=corpus)
    wrong = {GOLD: True, "'day'": False}

    def run(constructor=None, verifier=None, rubric=None):
        return synthesize_qa(entity, "q0", constructor=constructor or _constructor(),
                             answerers=[_answerer("a", "Answer: 'day'")], verifier=verifier or _verifier(wrong),
                             rubric_writer=rubric or _rubric_writer(), config=config)  # fmt: skip

    with pytest.raises(JobFailed, match="the question constructor got no reply: the script has no reply 1"):
        run(constructor=_dead("constructor"))
    with pytest.raises(JobFailed, match="the verifier got no reply") as err:
        run(verifier=_dead("verifier"))
    assert set(err.value.usage.roles) == {"constructor", "answerer:a", "verifier"}
    with pytest.raises(JobFailed, match="the rubric writer got no reply") as err:
        run(rubric=_dead("rubric"))
    assert err.value.usage.roles["verifier"].calls == 3
    # a local model's failure (a full window) is its result, the same on every run
    local = _dead("verifier")
    local.retry_errors = False
    assert run(verifier=local).dropped == [{"reason": "the verifier gave no verdict"}]
    monkeypatch.setattr(BackendSpec, "make", lambda self: None)  # no model is loaded for the check
    assert BackendSpec("openai", "m", "http://127.0.0.1:9/v1").agent("a", 5).retry_errors is True
    assert BackendSpec("local", "smollm2").agent("a", 5).retry_errors is False


def test_an_answer_agent_whose_endpoint_fails_is_not_a_wrong_answer(corpus):
    wrong = {GOLD: True, "'day'": False}
    verifier = _verifier(wrong, wrong)
    with pytest.raises(JobFailed, match="answer agent 'b' got no reply: the script has no reply 1") as err:
        _run(corpus, [_answerer("a", "Answer: 'day'"), _dead("b")], verifier)
    assert verifier.backend.calls == [] and set(err.value.usage.roles) == {
        "constructor",
        "answerer:a",
        "answerer:b",
    }
    local = _dead("b")
    local.retry_errors = False  # a local model that fills its window did not find the truth
    result = _run(corpus, [_answerer("a", "Answer: 'day'"), local], _verifier(wrong, wrong))
    assert len(result.items) == 1 and result.items[0].task["info"]["candidates"][1]["answer"] is None


def test_breadth_caps_the_results_of_the_constructors_search(corpus):
    from dsv32.synth.records import RoleUsage
    from dsv32.synth.searchqa import construct

    entity = shared_index(corpus).by_id["quokka.Burrow"]
    spec = AgentSpec("constructor", ScriptedBackend([
        _call("search", query="quokka burrow den", k=10), _call("search", query="quokka burrow den"),
        {"content": "No question."},
    ]))  # fmt: skip
    with SearchEnv(corpus) as env:
        assert construct(spec, entity, env, SearchQAConfig(breadth=2, corpus=corpus), RoleUsage()) is None
    results = [m["content"] for m in spec.backend.calls[-1].messages if m["role"] == "tool"]
    assert [r.count("\n[") + 1 for r in results] == [2, 2]  # the corpus has more matches
    search = next(t for t in spec.backend.calls[0].tools if t["function"]["name"] == "search")
    assert (
        search["function"]["parameters"]["properties"]["k"]["description"]
        == "how many results, 1 to 2 (default 2)"
    )
    with pytest.raises(SynthError, match="breadth must be at most 20"):
        SearchQAConfig(breadth=21)
