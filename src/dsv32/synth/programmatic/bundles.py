"""Writing an environment's tasks as ``general-tools`` bundles and checking each one as the synthesis
loop checks a version, with the same code: the harness reads the tool schemas off ``tools.py`` and
runs ``solve`` (recording its calls: the reference), the environment's runner verifies.

A bundle holds what the loop exports (``task.json`` with the reference calls and answer, ``db.sqlite``,
``tools.json``, ``tools.py``, ``verify.py``, and ``solution.py`` beside them). It is kept only when:
the solution follows the loop's rules and makes 2-4 tool calls; its answer passes the verifier; the
verifier rejects the empty answer after the same calls, every :data:`CONSTANT_ANSWERS` on the
untouched database, and — for a task that changes the database — the reference answer on the
untouched database (the no-op); and the runner's own self-check replays the written reference with
reward 1. These checks run in-process on a scratch copy: the bundle's code is this package's, not a
model's; :func:`.generate.sandbox_check` plays bundles in the sandbox through ``general-tools`` as the loop does.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from dsv32.envs.general import runner
from dsv32.envs.general.bundle import load_bundle, with_params
from dsv32.synth import harness
from dsv32.synth.programmatic.environment import Environment
from dsv32.synth.programmatic.tasks import CONSTANT_ANSWERS
from dsv32.synth.programmatic.toolset import KINDS, render
from dsv32.synth.records import SynthError, tool_signature
from dsv32.synth.versions import solution_problems

VERIFY_SOURCE = Path(__file__).with_name("sources") / "verify.py"
BUNDLE_FILES = ("task.json", "db.sqlite", "tools.json", "tools.py", "verify.py", "solution.py")
JSON_TYPES = {"int": "integer", "str": "string"}


class BundleCheckError(SynthError):
    """A generated bundle that fails its own checks: a bug of the generator, named with the task."""


def _scratch_root() -> str | None:
    """A memory filesystem for the checks' scratch copies where there is one (each tool call that
    writes commits, and a commit on disk waits for the disk), else the default temporary directory."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _expect_schema(env: Environment, schemas: list[dict]) -> None:
    """The harness's reading of ``tools.py`` must be the toolset as drawn."""
    got = {s["function"]["name"]: s["function"]["parameters"] for s in schemas}
    for t in env.tools:
        kind = KINDS[t.kind]
        types = dict(kind.roles)
        want = {
            "type": "object",
            "properties": {a: {"type": JSON_TYPES[types[r]]} for r, a in t.args},
            "required": [a for r, a in t.args if r not in kind.optional],
        }
        if got.get(t.name) != want:
            raise BundleCheckError(
                f"{env.id}: tool {t.name}: the harness reads {got.get(t.name)}, not {want}"
            )
    if set(got) != {t.name for t in env.tools}:
        raise BundleCheckError(f"{env.id}: tools.py defines {sorted(got)}")


def _verdict(code: Path, initial: Path, final: Path, answer: str) -> dict:
    out = runner.verify(str(code), str(initial), str(final), json.dumps(answer))
    if not out["ok"]:
        raise BundleCheckError(f"{code.name}: the verifier failed: {out['error']}")
    return out


def _check_task(code: Path, task_id: str, solution: str, writes: bool) -> dict:
    """Run the scratch workspace ``code`` (db.sqlite, tools.py, solution.py, verify.py) as the loop
    does and return ``solve``'s recorded calls and answer; :class:`BundleCheckError` if a check fails."""
    problems = solution_problems(solution)
    if problems:
        raise BundleCheckError(f"{task_id}: solution.py breaks the rules: {problems}")
    initial, run = code / "db.sqlite", code.parent / f"{code.name}-run.sqlite"
    shutil.copyfile(initial, run)
    solved = harness.solve(str(code), str(run))
    calls, answer = solved["calls"], solved["answer"]
    if not 2 <= len(calls) <= 4:
        raise BundleCheckError(f"{task_id}: the solution makes {len(calls)} tool calls, not 2-4")
    passed = _verdict(code, initial, run, answer)
    if not passed["passed"]:
        raise BundleCheckError(f"{task_id}: the solution fails its verifier: {passed['reason']}")
    idle = [(run, "", "the empty answer after the reference calls")]
    idle += [(initial, c, f"the constant answer {c!r} on the untouched database") for c in CONSTANT_ANSWERS]
    if writes:
        idle.append((initial, answer, "the reference answer on the untouched database"))
    for final, text, what in idle:
        if _verdict(code, initial, final, text)["passed"]:
            raise BundleCheckError(f"{task_id}: the verifier accepts {what}")
    return solved


def write_environment(env: Environment, *, bundles: Path, provenance: dict) -> list[dict]:
    """Write ``env``'s tasks as bundles ``bundles/<env id>-t<j>`` and check each; their task rows."""
    world = env.world
    keys = {t.name: t.columns["id"] for t in world.tables.values()}
    title = f"Tools of {env.id}, a {env.domain} environment generated by `dsv32 synth envs`."
    rows = []
    with tempfile.TemporaryDirectory(prefix="dsv32-envgen-", dir=_scratch_root()) as scratch:
        base = Path(scratch, "env")
        base.mkdir()
        world.write(base / "db.sqlite")
        (base / "tools.py").write_text(render(world, env.tools, title), encoding="utf-8")
        schemas = harness.schema(str(base))["tools"]
        _expect_schema(env, schemas)
        verify_source = VERIFY_SOURCE.read_text(encoding="utf-8")
        for j, task in enumerate(env.tasks):
            task_id = f"{env.id}-t{j}"
            code = Path(scratch, task_id)
            code.mkdir()
            for name in ("db.sqlite", "tools.py"):
                shutil.copyfile(base / name, code / name)
            params = {"keys": keys, "change": task.change, "answer": task.answer}
            (code / "verify.py").write_text(with_params(verify_source, params), encoding="utf-8")
            (code / "solution.py").write_text(task.solution, encoding="utf-8")
            solved = _check_task(code, task_id, task.solution, task.change is not None)
            record = {
                "id": task_id,
                "prompt": task.prompt,
                "category": env.domain,
                "difficulty": len(solved["calls"]),
                "reference": {"calls": solved["calls"], "answer": solved["answer"]},
                "provenance": {
                    **provenance,
                    "environment": env.id,
                    "index": env.index,
                    "template": task.template,
                },
            }
            text = json.dumps(record, indent=1, ensure_ascii=False)
            (code / "task.json").write_text(text, encoding="utf-8")
            (code / "tools.json").write_text(json.dumps(schemas, indent=1), encoding="utf-8")
            replayed = runner.check(str(code), str(Path(scratch, f"{task_id}-check.sqlite")))
            if replayed["failed_calls"] or not replayed["reference"]["passed"]:
                raise BundleCheckError(f"{task_id}: the runner's replay of the reference fails: {replayed}")
            dest = bundles / task_id
            dest.mkdir(parents=True)
            for name in BUNDLE_FILES:
                shutil.copyfile(code / name, dest / name)
            load_bundle(dest)
            info = {
                "bundle": str(dest.resolve()),
                "environment": env.id,
                "template": task.template,
                "reference_calls": len(solved["calls"]),
                "tool_signature": tool_signature(schemas),
            }
            rows.append(
                {"id": task_id, "prompt": task.prompt, "answer": None, "domain": env.domain, "info": info}
            )
    return rows
