"""Rubrics for GRM-style scoring of open-ended answers (paper §3.2.3: "detailed evaluation rubrics
across multiple quality dimensions ... a generative reward model scores responses on them").

A rubric is ``{"criteria": [{"name", "description", "weight"}]}`` with 2–8 criteria and weights that
are normalized to sum to 1. A generative reward model reads :func:`grading_messages` and replies
``{"scores": {name: s}}`` with each ``s`` in [0, 1]; the reward is ``Σ_c weight_c · s_c``
(:func:`rubric_score`).
"""

from __future__ import annotations

import json
import re

from dsv32.synth.prompts import RUBRIC_SYSTEM, RUBRIC_USER
from dsv32.synth.records import RoleUsage, SynthError
from dsv32.synth.roles import AgentSpec

_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


def parse_json_reply(text: str) -> object:
    """The JSON object of a model reply (a surrounding Markdown code fence is allowed)."""
    return json.loads(_FENCE.sub("", text.strip()))


def check_rubric(value: object) -> dict | str:
    """The rubric with normalized weights, or what is wrong with it (a string)."""
    if not isinstance(value, dict) or not isinstance(value.get("criteria"), list):
        return 'a rubric is {"criteria": [...]}'
    criteria = value["criteria"]
    if not 2 <= len(criteria) <= 8:
        return f"a rubric needs 2 to 8 criteria, got {len(criteria)}"
    out = []
    for c in criteria:
        if not isinstance(c, dict) or not all(
            isinstance(c.get(k), str) and c[k].strip() for k in ("name", "description")
        ):
            return "each criterion needs a non-empty name and description"
        weight = c.get("weight")
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
            return f"criterion {c['name']!r}: weight must be a number > 0"
        out.append(
            {"name": c["name"].strip(), "description": c["description"].strip(), "weight": float(weight)}
        )
    if len({c["name"] for c in out}) != len(out):
        return "criterion names must be distinct"
    total = sum(c["weight"] for c in out)
    for c in out:
        c["weight"] = round(c["weight"] / total, 6)
    return {"criteria": out}


def write_rubric(
    spec: AgentSpec, question: str, answer: str, evidence: list[str], usage: RoleUsage
) -> dict | str:
    """Ask ``spec`` for a rubric (one retry after a malformed reply); the rubric or the last problem."""
    messages = [
        {"role": "system", "content": RUBRIC_SYSTEM},
        {
            "role": "user",
            "content": RUBRIC_USER.format(question=question, answer=answer, evidence=", ".join(evidence)),
        },
    ]
    problem = ""
    for _ in range(2):
        text = spec.complete(messages, usage, "rubric")
        try:
            checked = check_rubric(parse_json_reply(text))
        except json.JSONDecodeError as err:
            checked = f"the reply is not JSON ({err.msg})"
        if isinstance(checked, dict):
            return checked
        problem = checked
        messages = [*messages, {"role": "assistant", "content": text},
                    {"role": "user", "content": f"That rubric is malformed: {problem}. Reply with the JSON only."}]  # fmt: skip
    return problem


def grading_messages(rubric: dict, question: str, response: str, reference: str | None = None) -> list[dict]:
    """The prompt a generative reward model scores ``response`` with."""
    listed = "\n".join(
        f"- {c['name']} (weight {c['weight']}): {c['description']}" for c in rubric["criteria"]
    )
    ref = f"\nReference answer: {reference}" if reference is not None else ""
    system = (
        "You grade a response against a rubric. For each criterion give a score from 0 to 1. Reply with "
        'JSON only: {"scores": {"<criterion name>": score, ...}}.'
    )
    user = f"Question: {question}{ref}\n\nRubric:\n{listed}\n\nResponse:\n{response}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def rubric_score(rubric: dict, reply: str) -> float:
    """``Σ weight · score`` from a grader's JSON reply; a missing or out-of-range score is an error."""
    try:
        scores = parse_json_reply(reply)["scores"]
    except (json.JSONDecodeError, TypeError, KeyError) as err:
        raise SynthError(f"the grader's reply is not {{'scores': {{...}}}} JSON: {err}") from err
    total = 0.0
    for c in rubric["criteria"]:
        s = scores.get(c["name"]) if isinstance(scores, dict) else None
        if isinstance(s, bool) or not isinstance(s, int | float) or not 0 <= s <= 1:
            raise SynthError(f"the grader gave criterion {c['name']!r} no score in [0, 1] (got {s!r})")
        total += c["weight"] * s
    return total
