"""Runs one function of a task bundle, inside the sandbox; prints one JSON line and exits.

    python runner.py call BUNDLE DB NAME < ARGS_JSON      # tools.NAME(db, **args) on the episode's DB
    python runner.py verify BUNDLE INITIAL_DB FINAL_DB < ANSWER_JSON
    python runner.py check BUNDLE WORK_DB                 # the bundle's self-check, one process

A call's arguments and the answer come on standard input (they are the model's, of any size: a
program argument holds at most 128 KiB).

``call`` opens ``DB`` (the episode's copy of the database), runs the tool and commits; it prints
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": "..."}`` (a tool raising is the model's
problem to read about, not a crash). ``verify`` opens both databases read-only and prints
``{"ok": true, "passed": bool, "reason": "..."}``; an ``AssertionError`` raised by ``verify`` counts
as a fail whose message is the reason. ``check`` copies the initial database to ``WORK_DB``, plays
the reference calls there, and verifies three endings: the reference (must pass), the reference
calls with an empty answer, and the untouched database with the reference answer (must fail).
Standard library only: it runs as ``python -I -S``.
"""

import importlib.util
import inspect
import json
import sqlite3
import sys
import traceback


def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def call(bundle: str, db_path: str, name: str, args_json: str) -> dict:
    tools = _load(f"{bundle}/tools.py", "bundle_tools")
    func = getattr(tools, name, None)
    if name.startswith("_") or not inspect.isfunction(func):
        return {"ok": False, "error": f"unknown tool {name!r}"}
    args = json.loads(args_json)
    try:
        inspect.signature(func).bind(None, **args)
    except TypeError as err:
        return {"ok": False, "error": f"bad arguments for {name}: {err}"}
    db = sqlite3.connect(db_path)
    db.row_factory = sqlite3.Row
    try:
        result = func(db, **args)
        db.commit()
    except Exception as err:  # the tool's own failure is the model's to read
        db.rollback()
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}
    finally:
        db.close()
    return {"ok": True, "result": result}


def verify(bundle: str, initial: str, final: str, answer_json: str) -> dict:
    module = _load(f"{bundle}/verify.py", "bundle_verify")
    if not inspect.isfunction(getattr(module, "verify", None)):
        return {"ok": False, "error": "verify.py must define verify(initial_db, final_db, answer)"}
    dbs = [sqlite3.connect(f"file:{path}?mode=ro", uri=True) for path in (initial, final)]
    for db in dbs:
        db.row_factory = sqlite3.Row
    try:
        passed = bool(module.verify(dbs[0], dbs[1], json.loads(answer_json)))
        reason = "the verifier accepted the result" if passed else "the verifier rejected the result"
    except AssertionError as err:
        passed, reason = False, str(err) or "an assertion of the verifier failed"
    finally:
        for db in dbs:
            db.close()
    return {"ok": True, "passed": passed, "reason": reason}


def check(bundle: str, work_db: str) -> dict:
    import shutil

    with open(f"{bundle}/task.json", encoding="utf-8") as f:
        reference = json.load(f)["reference"]
    initial = f"{bundle}/db.sqlite"
    shutil.copyfile(initial, work_db)
    untouched = verify(bundle, initial, initial, json.dumps(reference["answer"]))
    failed_calls = []
    for c in reference["calls"]:
        out = call(bundle, work_db, c["name"], json.dumps(c["arguments"]))
        if not out["ok"]:
            failed_calls.append(f"{c['name']}: {out['error']}")
    return {
        "ok": True,
        "failed_calls": failed_calls,
        "reference": verify(bundle, initial, work_db, json.dumps(reference["answer"])),
        "empty_answer": verify(bundle, initial, work_db, json.dumps("")),
        "untouched": untouched,
    }


def main(argv: list[str]) -> None:
    try:
        modes = {"call": call, "verify": verify, "check": check}
        given = argv[2:4] if argv[1] == "check" else [*argv[2:5], sys.stdin.read()]
        out = modes[argv[1]](*given)
        text = json.dumps(out, default=str)
    except Exception:
        text = json.dumps({"ok": False, "error": "the bundle failed:\n" + traceback.format_exc(limit=3)})
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main(sys.argv)
