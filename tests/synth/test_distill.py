"""Specialist distillation: only outputs the domain's verifier accepts are kept, duplicates are
dropped, the per-domain weights set the mix, and the report counts every episode."""

from __future__ import annotations

import json
import random
from typing import ClassVar

import pytest

from dsv32.envs.base import Environment, Reward, Task, tool_schema
from dsv32.synth.distill import Specialist, distill, mix, parse_pairs
from dsv32.synth.records import SynthError


class DoubleEnv(Environment):
    """Tool ``double(x)``; the answer must be ``2x``."""

    name = "double"

    def reset(self, task):
        self.task = task
        return [{"role": "system", "content": "Use double."}, {"role": "user", "content": task.prompt}]

    def tools(self):
        return [tool_schema("double", "Double x.", {"x": {"type": "integer"}})]

    def call(self, name, arguments):
        return str(2 * arguments["x"])

    def reward(self, trajectory):
        return Reward(float((trajectory.final or "").strip() == self.task.answer))

    def reference(self, task):
        return []


class Specialist_:
    """A scripted specialist: calls the tool, then answers with the tool's result (right) or with
    ``wrong_from``+ (wrong) for tasks whose number is at least ``wrong_from``."""

    thinking = True
    sampling: ClassVar[dict] = {}

    def __init__(self, label, wrong_from=10**9):
        self.label, self.wrong_from = label, wrong_from

    def make(self):
        from dsv32.agent import ScriptedBackend

        def act(messages, tools):
            x = int(messages[1]["content"])
            call = {"type": "function", "function": {"name": "double", "arguments": {"x": x}}}
            return {"content": "", "reasoning_content": "double it", "tool_calls": [call]}

        def answer(messages, tools):
            x = int(messages[1]["content"])
            return {"content": str(2 * x if x < self.wrong_from else -1), "reasoning_content": "done"}

        return ScriptedBackend([act, answer])


def _tasks(prefix, xs):
    return [Task(f"{prefix}{x}", str(x), str(2 * x)) for x in xs]


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_only_verified_outputs_are_kept_and_duplicates_dropped(tmp_path):
    a = Specialist("math", DoubleEnv, _tasks("a", [1, 2, 30, 40]), Specialist_("math-model", wrong_from=10))
    b = Specialist("code", DoubleEnv, _tasks("b", [5, 6]), Specialist_("code-model"))
    reports = distill([a, b], tmp_path / "mix.jsonl", samples=2, prompt="env", workers=3)
    ra, rb = reports["math"], reports["code"]
    assert (ra.episodes, ra.kept, ra.rejected) == (8, 4, 4)
    assert ra.reasons == {"reward 0": 4}
    assert ra.duplicates == 2 and ra.written == 2  # the scripted specialist answers alike twice
    assert (rb.episodes, rb.kept, rb.duplicates, rb.written) == (4, 4, 2, 2)
    rows = _rows(tmp_path / "mix.jsonl")
    assert [r["id"] for r in rows] == ["a1", "a2", "b5", "b6"]
    assert all(r["messages"][-1]["content"] == str(2 * int(r["messages"][1]["content"])) for r in rows)
    assert {r["domain"] for r in rows} == {"math", "code"}
    assert rows[0]["meta"]["source"] == "math-model" and rows[0]["tools"][0]["function"]["name"] == "double"


def test_weights_set_the_mix(tmp_path):
    a = Specialist("math", DoubleEnv, _tasks("a", range(1, 5)), Specialist_("m"), weight=2.0)
    b = Specialist("code", DoubleEnv, _tasks("b", range(5, 9)), Specialist_("c"), weight=0.5)
    reports = distill([a, b], tmp_path / "mix.jsonl", prompt="bare")
    assert reports["math"].written == 8 and reports["code"].written == 2
    counts = {}
    for r in _rows(tmp_path / "mix.jsonl"):
        counts[r["domain"]] = counts.get(r["domain"], 0) + 1
    assert counts == {"math": 8, "code": 2}


def test_mix_and_pairs():
    rows = [{"i": i} for i in range(10)]
    assert len(mix(rows, 1.3, random.Random(0))) == 13
    assert mix(rows, 0, random.Random(0)) == []
    assert parse_pairs(["a=local:x", "b=openai:m@http://h/v1"], "--specialist") == {
        "a": "local:x",
        "b": "openai:m@http://h/v1",
    }
    with pytest.raises(SynthError, match="given twice"):
        parse_pairs(["a=x", "a=y"], "--specialist")
    with pytest.raises(SynthError, match="given twice"):
        parse_pairs(["a=x", " a =y"], "--specialist")


def test_the_union_is_deduplicated_across_domains(tmp_path):
    a = Specialist("math", DoubleEnv, _tasks("a", [3]), Specialist_("m"))
    b = Specialist("code", DoubleEnv, _tasks("b", [3]), Specialist_("c"))
    reports = distill([a, b], tmp_path / "mix.jsonl", prompt="bare")
    assert (reports["math"].written, reports["code"].written, reports["code"].duplicates) == (1, 0, 1)


def test_an_unknown_prompt_is_refused_before_any_episode(tmp_path):
    a = Specialist("math", DoubleEnv, _tasks("a", [3]), Specialist_("m"))
    with pytest.raises(SynthError, match="prompt 'fancy' is not one of"):
        distill([a], tmp_path / "mix.jsonl", prompt="fancy")
    with pytest.raises(SynthError, match="samples and workers must be >= 1"):
        distill([a], tmp_path / "mix.jsonl", samples=0)
    assert not (tmp_path / "mix.jsonl").exists()


@pytest.mark.parametrize("weight", [-1.0, float("nan"), float("inf")])
def test_a_weight_that_is_not_a_finite_number_at_least_0_is_refused_up_front(weight):
    with pytest.raises(SynthError, match=r"domain 'math': a mix weight must be a finite number >= 0"):
        Specialist("math", DoubleEnv, _tasks("a", [3]), Specialist_("m"), weight=weight)
    with pytest.raises(SynthError, match="a mix weight must be a finite number >= 0"):
        mix([{"i": 0}], weight, random.Random(0))


class DownSpecialist(Specialist_):
    """Its endpoint fails every call."""

    def make(self):
        from dsv32.agent import ScriptedBackend

        return ScriptedBackend([])


def test_an_empty_mix_never_replaces_the_output_and_an_existing_one_needs_overwrite(tmp_path):
    out = tmp_path / "mix.jsonl"
    distill([Specialist("math", DoubleEnv, _tasks("a", [1]), Specialist_("m"))], out, prompt="bare")
    before = out.read_bytes()
    with pytest.raises(SynthError, match=r"mix\.jsonl exists; pass --overwrite"):
        distill([Specialist("math", DoubleEnv, _tasks("a", [2]), DownSpecialist("m"))], out, prompt="bare")
    down = Specialist("math", DoubleEnv, _tasks("a", [1, 2]), DownSpecialist("m"))
    with pytest.raises(SynthError, match=r"every episode \(2\) stopped with an error"):
        distill([down], out, prompt="bare", overwrite=True)
    wrong = Specialist("math", DoubleEnv, _tasks("a", [30]), Specialist_("m", wrong_from=10))
    with pytest.raises(SynthError, match=r"no conversation to write \(1 × reward 0\)"):
        distill([wrong], out, prompt="bare", overwrite=True)
    unweighted = Specialist("math", DoubleEnv, _tasks("a", [3]), Specialist_("m"), weight=0)
    with pytest.raises(SynthError, match=r"\(the mix weights keep none of the verified ones\)"):
        distill([unweighted], out, prompt="bare", overwrite=True)
    assert out.read_bytes() == before
    distill(
        [Specialist("math", DoubleEnv, _tasks("a", [4, 5]), Specialist_("m"))],
        out,
        prompt="bare",
        overwrite=True,
    )
    assert [r["id"] for r in _rows(out)] == ["a4", "a5"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mix.jsonl"]
