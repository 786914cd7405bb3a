"""BFCL v4 multi-turn categories: conversations over BFCL's executable API classes, through
``dsv32.agent`` in V3.2's tool-call protocol, graded by BFCL's state and response checks.

An episode, per user turn (BFCL's inference loop, with the agent in place of its handler):

1. the turn's user message joins the conversation (a ``miss_func`` turn first adds the functions
   that were held out and says so, in BFCL's words); the entry's functions (minus
   ``excluded_function`` and the ones still held out) are the tools;
2. ``Agent.run`` lets the model call tools until it answers without one (at most 20 steps per turn,
   BFCL's limit, or ``max_steps`` if smaller; hitting it fails the entry). Every call runs in the
   ``model`` world of the sandboxed :class:`~dsv32.eval.bfcl.api.ApiWorker`; its result is the tool
   message;
3. the turn's ground-truth calls run in the ``truth`` world, then BFCL's checks: a turn whose ground
   truth is empty must get no call (irrelevance); otherwise the model must have called something,
   every public attribute of every API instance must equal the ground truth's (state check), and
   the ground truth's results must all be among the results of the model's calls so far (response
   check, unordered, with multiplicity). The first failing check ends the episode with score 0 and
   its reason; an entry that passes every turn scores 1.

Entries whose ground truth calls a function the entry does not offer at that turn (one still held
out) or passes arguments of the wrong type for its declared schema (a string ``ticket_id`` for an
integer) are left out and listed under ``excluded`` (5 of the 800 in bfcl-eval 2026.3.23): BFCL
executes such a call as written, but through ``dsv32.agent`` a call is checked against its schema
before it runs, so no answer could pass.

The reference plays each turn's ground-truth calls as one assistant message with those tool calls,
then a short answer (a turn with no ground truth gets only the answer), through the same agent path.
"""

from __future__ import annotations

import json
from typing import Any

from dsv32.eval.bfcl import groups
from dsv32.eval.bfcl.api import ApiWorker, WorkerError, parse_call
from dsv32.eval.bfcl.data import chosen_categories, load_answers, load_entries, load_file, openai_tool
from dsv32.eval.types import Benchmark, EpisodeResult, Problem, RunOptions, Score

CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
STEP_LIMIT = 20  # BFCL's MAXIMUM_STEP_LIMIT per turn
ADDED_FUNCTIONS = "I have updated some more functions you can choose from. What about now?"
DOCS = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}


def function_docs(classes: list[str]) -> list[dict]:
    """The function docs of the API classes (read once per class; shared, not to be changed)."""
    return [doc for name in classes for doc in load_file(f"multi_turn_func_doc/{DOCS[name]}")]


def _multiset_missing(expected: list[str], got: list[str]) -> list[str]:
    pool, missing = list(got), []
    for item in expected:
        if item in pool:
            pool.remove(item)
        else:
            missing.append(item)
    return missing


def _held(entry: dict) -> dict[int, list[str]]:
    """``{turn: function names}`` of a ``miss_func`` entry: held out until that turn."""
    return {int(t): names for t, names in (entry.get("missed_function") or {}).items()}


def offered_docs(entry: dict) -> list[list[dict]]:
    """The function docs offered at each turn: the classes' functions minus ``excluded_function`` and
    minus the held-out ones, which join after the others at their turn."""
    held = _held(entry)
    excluded = set(entry.get("excluded_function") or [])
    docs = [d for d in function_docs(entry["involved_classes"]) if d["name"] not in excluded]
    hidden = {n for names in held.values() for n in names}
    available = [d for d in docs if d["name"] not in hidden]
    turns = []
    for t in range(len(entry["question"])):
        if t in held:
            available = available + [d for d in docs if d["name"] in held[t]]
        turns.append(available)
    return turns


def unsatisfiable(entry: dict) -> str | None:
    """Why no model can pass the entry through its tools, or None: a ground-truth call of a function
    the entry does not offer at that turn, or with arguments its declared schema rejects (the agent
    checks every call against the schema before it runs)."""
    from dsv32.agent.schema import check_arguments

    for t, (calls, offered) in enumerate(zip(entry["truth"], offered_docs(entry), strict=True)):
        docs = {d["name"]: d for d in offered}
        for text in calls:
            name, kwargs = parse_call(text, entry["involved_classes"])
            if name not in docs:
                return f"turn {t}: the ground truth calls {name!r}, which the entry does not offer then"
            problems = check_arguments(kwargs, openai_tool(docs[name])["function"]["parameters"])
            if problems:
                return f"turn {t}: the ground truth's {text} breaks the function's schema ({problems[0]})"
    return None


class _Turn:
    """The tools of one turn: each call goes to the worker's model world and is recorded."""

    def __init__(self, worker: ApiWorker) -> None:
        self.worker = worker
        self.results: list[str] = []

    def tool(self, doc: dict) -> Any:
        from dsv32.agent import tool

        name = doc["name"]

        def call(**arguments: Any) -> str:
            result = self.worker.call("model", name, arguments)
            self.results.append(result)
            return result

        return tool(call, schema=openai_tool(doc))


class BFCLMultiTurn(Benchmark):
    name = "bfcl-multi-turn"
    kind = "episode"
    description = "BFCL v4 multi-turn: BFCL's API classes executed in the sandbox, state + response checks"
    source = "the bfcl-eval package's data/BFCL_v4_multi_turn_*.json and its func_source_code classes"
    packages = ("bfcl-eval",)
    metric = "accuracy"

    def subset_summaries(self, subsets: dict[str, dict]) -> dict:
        """BFCL's own group scores under ``bfcl`` (:mod:`dsv32.eval.bfcl.groups`)."""
        return {"bfcl": groups.from_subsets(subsets)} if subsets else {}

    def subsets(self) -> list[str]:
        return list(CATEGORIES)

    def problems(self, subset: list[str] | None = None, data: str | None = None) -> list[Problem]:
        out = []
        for category in chosen_categories("bfcl-multi-turn", subset, CATEGORIES):
            truths = load_answers(category)
            for entry in load_entries(category):
                entry["truth"] = truths[entry["id"]]
                entry["category"] = category
                why = unsatisfiable(entry)
                if why is not None:
                    self.excluded[entry["id"]] = why
                    continue
                out.append(Problem(entry["id"], entry["question"][0], [], category, entry))
        return out

    def reference_replies(self, problem: Problem) -> list[dict]:
        entry, replies = problem.data, []
        for t, calls in enumerate(entry["truth"]):
            if calls:
                tool_calls = []
                for k, text in enumerate(calls):
                    name, kwargs = parse_call(text, entry["involved_classes"])
                    function = {"name": name, "arguments": json.dumps(kwargs, ensure_ascii=False)}
                    tool_calls.append({"id": f"ref_{t}_{k}", "type": "function", "function": function})
                replies.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
                replies.append({"role": "assistant", "content": "Done."})
            else:
                replies.append(
                    {"role": "assistant", "content": "I cannot do that with the functions I have."}
                )
        return replies

    def episode(self, problem: Problem, backend: Any, options: RunOptions) -> EpisodeResult:
        from dsv32.agent import Agent

        entry = problem.data
        classes = entry["involved_classes"]
        held, offered = _held(entry), offered_docs(entry)
        agent_options = {**options.agent_options(), "max_steps": min(STEP_LIMIT, options.max_steps)}
        result = EpisodeResult([], Score(0.0, ""))
        long_context = "long_context" in entry["category"]
        try:
            with ApiWorker(classes, entry.get("initial_config", {}), long_context) as worker:
                all_results: list[str] = []
                messages: list[dict] = []
                for t, turn_messages in enumerate(entry["question"]):
                    if t in held:
                        turn_messages = [{"role": "user", "content": ADDED_FUNCTIONS}]
                    turn = _Turn(worker)
                    agent = Agent(backend, [turn.tool(d) for d in offered[t]], **agent_options)
                    trajectory = agent.run(messages + list(turn_messages))
                    messages = trajectory.messages
                    result.messages = messages
                    result.steps += trajectory.total_steps
                    result.tokens += trajectory.total_tokens
                    result.resets += len(trajectory.context_events)
                    result.stop_reason, result.final = trajectory.stop_reason, trajectory.final
                    all_results += turn.results
                    why = self._check_turn(t, entry, worker, trajectory, turn.results, all_results)
                    if why is not None:
                        result.score = Score(0.0, why)
                        return result
        except WorkerError as err:
            result.score = Score(0.0, str(err))
            return result
        result.score = Score(1.0, f"all {len(entry['question'])} turns match")
        return result

    @staticmethod
    def _check_turn(
        t: int, entry: dict, worker: ApiWorker, trajectory: Any, made: list[str], so_far: list[str]
    ) -> str | None:
        if trajectory.stop_reason == "error":
            return f"turn {t}: the model call failed: {trajectory.error}"
        if trajectory.stop_reason == "max_steps":
            return (
                f"turn {t}: no answer within {trajectory.num_steps} steps (BFCL allows {STEP_LIMIT} per turn)"
            )
        if trajectory.stop_reason != "answer":
            return f"turn {t}: stopped by {trajectory.stop_reason}"
        calls = entry["truth"][t]
        if not calls:
            return f"turn {t}: made {len(made)} call(s) where no function fits" if made else None
        truth = [worker.call("truth", *parse_call(c, entry["involved_classes"])) for c in calls]
        if not made:
            return f"turn {t}: made no call"
        differences = worker.differences()
        if differences:
            cls, attrs = next(iter(differences.items()))
            return f"turn {t}: {cls} state differs from the ground truth's in {sorted(attrs)}"
        missing = _multiset_missing(truth, so_far)
        if missing:
            return f"turn {t}: {len(missing)} ground-truth result(s) missing, e.g. {missing[0][:120]!r}"
        return None
