"""Search-QA synthesis (paper §3.2.3, "Search Agent"): the multi-agent pipeline over a search corpus.

Per entity (one job):

1. **Entity**: long-tail documents of the corpus (:func:`sample_entities`: the document's own name
   is mentioned in at most ``max_mentions`` documents).
2. **Question construction**: an agent explores the entity with ``search``/``open`` (depth: the
   question needs facts from ≥ ``depth`` documents; breadth: its ``search`` returns at most
   ``breadth`` results per call) and calls ``submit_qa(question, answer, evidence)``; the host
   checks the evidence ids exist, include the entity and number ≥ ``depth``, the answer is short and
   not written in the question.
3. **Answer generation**: every configured answer agent (its own backend, prompt, sampling) runs the
   question as a ``search`` environment episode. One whose answer matches the ground truth under the
   environment's answer rule (:func:`dsv32.envs.search.matches`) means the question is too easy:
   dropped, without spending the verifier.
4. **Verification**: a verifier agent with search judges every distinct answer — the ground truth
   among the candidates, shuffled and unlabeled — in ``verify_passes`` independent passes. Kept only
   when every pass finds the ground truth correct and every candidate wrong.
5. **Rubric**: a rubric per kept task (weighted criteria) for GRM-style scoring of open-ended answers
   (:mod:`.rubric`).

Kept tasks are ``search`` environment rows (``answer`` = the ground truth) with the evidence, the
candidates and their verdicts, and the rubric under ``info``.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dsv32.agent import env_tools, tool
from dsv32.agent.errors import BackendError
from dsv32.envs.base import Task, tool_schema
from dsv32.envs.search import SearchEnv, extract
from dsv32.envs.search.corpus import Doc
from dsv32.envs.search.env import MAX_K
from dsv32.envs.search.index import Index, tokenize
from dsv32.synth.prompts import QA_CONSTRUCT_SYSTEM, QA_CONSTRUCT_USER, QA_VERIFY_SYSTEM, QA_VERIFY_USER
from dsv32.synth.records import JobFailed, RoleUsage, SynthError, normalize
from dsv32.synth.roles import AgentSpec
from dsv32.synth.rubric import write_rubric
from dsv32.synth.runner import Item, JobResult


@dataclass
class SearchQAConfig:
    depth: int = 2
    breadth: int = 5
    verify_passes: int = 2
    max_answer_chars: int = 120
    corpus: str | None = None  # a JSONL corpus; None: the standard library's documentation
    seed: int = 0

    def __post_init__(self) -> None:
        if self.depth < 1 or self.breadth < 1 or self.verify_passes < 1:
            raise SynthError("depth, breadth and verify_passes must be at least 1")
        if self.breadth > MAX_K:
            raise SynthError(f"breadth must be at most {MAX_K} (the most results one search returns)")


def sample_entities(index: Index, n: int, seed: int = 0, max_mentions: int = 3) -> list[Doc]:
    """``n`` long-tail documents: those whose name (the last dotted part of the title) occurs in at
    most ``max_mentions`` documents' text; the first ``n`` of one ``seed``-ed shuffle of them."""
    df: Counter = Counter()
    for doc in index.docs:
        df.update(set(tokenize(doc.text)))
    rare = []
    for doc in index.docs:
        name = tokenize(doc.title.rsplit(".", 1)[-1])
        if name and 0 < df[name[0]] <= max_mentions:
            rare.append(doc)
    if len(rare) < n:
        raise SynthError(
            f"the corpus has {len(rare)} long-tail documents (<= {max_mentions} mentions), not {n}"
        )
    random.Random(seed).shuffle(rare)
    return rare[:n]  # a prefix of one shuffle: asking for more later keeps the first n


@dataclass
class QA:
    question: str
    answer: str
    evidence: list[str] = field(default_factory=list)


def _contains(haystack: str, needle: str) -> bool:
    return f" {normalize(needle)} " in f" {normalize(haystack)} " if normalize(needle) else False


def _constructor_search(env: SearchEnv, breadth: int) -> Any:
    """The environment's ``search`` returning at most ``breadth`` results: breadth is how many results
    the constructor looks at per step, whatever ``k`` it asks for."""
    default = min(5, breadth)
    schema = tool_schema(
        "search",
        "BM25 search over the corpus; returns the best k documents (id, title, number of pages, snippet).",
        {"query": {"type": "string", "description": "keywords, e.g. a function's dotted name"},
         "k": {"type": "integer", "description": f"how many results, 1 to {breadth} (default {default})"}},
        required=["query"],
    )  # fmt: skip

    def search(**arguments: Any) -> str:
        k = arguments.get("k", default)
        if isinstance(k, int) and not isinstance(k, bool) and k > breadth:
            k = breadth
        return env.call("search", {**arguments, "k": k})

    return tool(search, schema=schema)


def construct(
    spec: AgentSpec, entity: Doc, env: SearchEnv, config: SearchQAConfig, usage: RoleUsage
) -> QA | None:
    """Stage 2: the question-construction agent's first valid ``submit_qa``, or None
    (:class:`JobFailed` when its endpoint failed before one)."""
    found: list[QA] = []

    def submit_qa(question: str, answer: str, evidence: list) -> str:
        if found:
            return "a question is already accepted; stop"
        ids = list(dict.fromkeys(str(e) for e in evidence))
        unknown = [e for e in ids if e not in env.index.by_id]
        problems = []
        if not question.strip() or not answer.strip():
            problems.append("question and answer must be non-empty")
        if len(answer) > config.max_answer_chars:
            problems.append(f"the answer must be short (<= {config.max_answer_chars} characters)")
        if unknown:
            problems.append(f"unknown document ids {unknown}; use ids from search results")
        if entity.id not in ids:
            problems.append(f"the evidence must include the entity's document {entity.id!r}")
        if len(ids) < config.depth:
            problems.append(f"the question must need facts from at least {config.depth} documents")
        if _contains(question, answer):
            problems.append("the answer appears in the question")
        if problems:
            return "rejected: " + "; ".join(problems)
        found.append(QA(question.strip(), answer.strip(), ids))
        return "accepted"

    schema = tool_schema(
        "submit_qa",
        "Submit the question, its short answer and the ids of the evidence documents.",
        {"question": {"type": "string"}, "answer": {"type": "string"},
         "evidence": {"type": "array", "items": {"type": "string"}}},
    )  # fmt: skip
    system = QA_CONSTRUCT_SYSTEM.format(depth=config.depth, breadth=config.breadth)
    snippet = " ".join(entity.text.split())[:600]
    user = QA_CONSTRUCT_USER.format(title=entity.title, doc_id=entity.id, snippet=snippet)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    tools = [t for t in env_tools(env) if t.name != "search"]
    tools += [_constructor_search(env, config.breadth), tool(submit_qa, schema=schema)]
    trajectory = spec.run(messages, tools, usage, "constructor")
    if not found and spec.failed(trajectory):
        raise JobFailed(f"the question constructor got no reply: {trajectory.error}", usage)
    return found[0] if found else None


def answer(spec: AgentSpec, task: Task, env: SearchEnv, usage: RoleUsage) -> dict:
    """Stage 3: one answer agent's episode: its extracted answer and whether it matches the truth.
    An endpoint outage is not a failure to find the truth (it would make every question look hard):
    :class:`JobFailed`."""
    trajectory = spec.run(env.reset(task), env_tools(env), usage, f"answerer:{spec.name}")
    if spec.failed(trajectory):
        raise JobFailed(f"answer agent {spec.name!r} got no reply: {trajectory.error}", usage)
    reward = env.reward(trajectory)
    final = trajectory.final
    return {
        "agent": spec.name,
        "answer": extract(final) if final else None,
        "correct": reward.value == 1.0,
        "stop_reason": trajectory.stop_reason,
    }


def verify(
    spec: AgentSpec, question: str, answers: list[str], env: SearchEnv, usage: RoleUsage
) -> dict[int, bool] | None:
    """Stage 4, one pass: ``{answer index: correct}`` for every answer, or None without a full verdict
    (:class:`JobFailed` when its endpoint failed before one)."""
    verdict: dict[int, bool] = {}

    def submit_verdict(verdicts: list) -> str:
        got = {}
        for v in verdicts:
            if (
                not isinstance(v, dict)
                or not isinstance(v.get("index"), int)
                or not isinstance(v.get("correct"), bool)
            ):
                return 'rejected: each verdict is {"index": int, "correct": bool, "reason": str}'
            got[v["index"]] = v["correct"]
        if set(got) != set(range(len(answers))):
            return f"rejected: give one verdict for each answer index 0..{len(answers) - 1}"
        verdict.clear()
        verdict.update(got)
        return "recorded"

    schema = tool_schema(
        "submit_verdict",
        "Submit one verdict per answer: index, correct, reason.",
        {"verdicts": {"type": "array", "items": {"type": "object"}}},
    )
    listed = "\n".join(f"[{i}] {a}" for i, a in enumerate(answers))
    messages = [
        {"role": "system", "content": QA_VERIFY_SYSTEM},
        {"role": "user", "content": QA_VERIFY_USER.format(question=question, answers=listed)},
    ]
    trajectory = spec.run(messages, [*env_tools(env), tool(submit_verdict, schema=schema)], usage, "verifier")
    if not verdict and spec.failed(trajectory):
        raise JobFailed(f"the verifier got no reply: {trajectory.error}", usage)
    return dict(verdict) if verdict else None


def synthesize_qa(
    entity: Doc,
    key: str,
    *,
    constructor: AgentSpec,
    answerers: list[AgentSpec],
    verifier: AgentSpec,
    rubric_writer: AgentSpec,
    config: SearchQAConfig,
) -> JobResult:
    """The whole pipeline for one entity (see the module docstring). An agent whose endpoint kept
    failing (:meth:`AgentSpec.failed`) before it did its part raises :class:`JobFailed`: an outage
    says nothing about the question, so the job runs again on the next run."""
    if not answerers:
        raise SynthError("search-QA synthesis needs at least one answer agent")
    result = JobResult(key)
    usage = result.usage
    with SearchEnv(config.corpus) as env:
        qa = construct(constructor, entity, env, config, usage)
        result.stats = {"entity": entity.id}
        if qa is None:
            result.dropped.append({"reason": "no question constructed", "entity": entity.id})
            return result
        result.stats.update(question=qa.question, answer=qa.answer)
        task = Task(f"sqa-{key}", qa.question, qa.answer, "search")
        candidates = result.stats["candidates"] = []
        for spec in answerers:
            candidates.append(answer(spec, task, env, usage))
            if candidates[-1]["correct"]:
                result.dropped.append(
                    {"reason": "an answer agent found the ground truth", "agent": spec.name}
                )
                return result
        given = list(dict.fromkeys(c["answer"] for c in candidates if c["answer"]))
        if any(normalize(a) == normalize(qa.answer) for a in given):
            result.dropped.append({"reason": "a candidate equals the ground truth"})
            return result
        answers = [qa.answer, *given]
        order = list(range(len(answers)))
        random.Random(f"{config.seed}:{key}").shuffle(order)
        shown = [answers[i] for i in order]  # shown[j] is answers[order[j]]
        passes = []
        for _ in range(config.verify_passes):
            verdict = verify(verifier, qa.question, shown, env, usage)
            if verdict is None:
                result.dropped.append({"reason": "the verifier gave no verdict"})
                return result
            passes.append({order[j]: ok for j, ok in verdict.items()})
        result.stats["verdicts"] = [[p[i] for i in range(len(answers))] for p in passes]
        if not all(p[0] for p in passes):
            result.dropped.append({"reason": "the ground truth was not verified"})
            return result
        if any(p[i] for p in passes for i in range(1, len(answers))):
            result.dropped.append({"reason": "a candidate was judged correct"})
            return result
        try:
            rubric = write_rubric(rubric_writer, qa.question, qa.answer, qa.evidence, usage)
        except BackendError as err:
            raise JobFailed(f"the rubric writer got no reply: {err}", usage) from None
        if isinstance(rubric, str):
            result.dropped.append({"reason": "the rubric is malformed", "detail": rubric})
            return result
    info = {
        "entity": entity.id,
        "evidence": qa.evidence,
        "depth": config.depth,
        "candidates": candidates,
        "verification_passes": config.verify_passes,
        "rubric": rubric,
    }
    row = {"id": task.id, "prompt": qa.question, "answer": qa.answer, "domain": "search", "info": info}
    result.items.append(Item(row, qa.question))
    return result
