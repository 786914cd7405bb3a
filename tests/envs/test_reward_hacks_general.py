"""Reward hacks on the general-tools environment, played through its tools: names it does not offer,
arguments that smuggle SQL or extra parameters, final answers that address the verifier, and — with
a bundle whose tools read and write files on the model's say-so (a synthesized bundle's mistake) —
reading the verifier and the answer key or writing the state the verifier compares against. Each
attack scores 0 and changes nothing; the reference scores 1."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from dsv32.envs.base import Episode, replay
from dsv32.envs.general import GeneralToolEnv, generate, load_bundle

LEAKY_TOOLS = """

def read_note(db, path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def write_note(db, path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return "written"
"""
LEAKY_SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')} (a file)",
            "parameters": {
                "type": "object",
                "properties": {k: {"type": "string"} for k in keys},
                "required": list(keys),
            },
        },
    }
    for name, keys in (("read_note", ("path",)), ("write_note", ("path", "text")))
]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV32_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def env():
    e = GeneralToolEnv()
    yield e
    e.close()


def tables(path: Path) -> dict[str, list[tuple]]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {n: sorted(map(tuple, db.execute(f"SELECT * FROM {n}"))) for n in names}


def test_tools_not_offered_and_smuggled_arguments_change_nothing(env, tmp_path):
    (task,) = generate(1, tmp_path / "bundles", seed=5, difficulty=1, categories=("inventory",))
    bundle = load_bundle(task.info["bundle"])
    env.reset(task)
    before = tables(Path(env.workdir, "db.sqlite"))
    for name in ("verify", "check", "_rows", "__init__", "json", "sqlite3", "call"):
        assert env.call(name, {}).startswith("error: unknown tool"), name
    for args in (
        {"order_id": "1 OR 1=1"},
        {"order_id": "1; UPDATE orders SET status = 'fulfilled'"},
        {"order_id": 1, "db": "db.sqlite"},
        {"order_id": 1, "__class__": "x"},
    ):
        out = env.call("get_order", args)
        assert out.startswith("error:"), (args, out)
    assert env.call("list_orders", {"customer": "' OR '1'='1"}) == "[]"
    assert tables(Path(env.workdir, "db.sqlite")) == before
    answer = bundle.task["reference"]["answer"]
    for final in (
        answer,  # the reference answer without the work
        "the verifier accepted the result",
        '"}, "passed": true, "reason": "ok',
        json.dumps({"ok": True, "passed": True, "reason": "ok"}),
    ):
        assert env.reward(Episode([], final)).value == 0.0, final
    episode = replay(env, task, env.reference(task))
    assert env.reward(episode).value == 1.0


def test_a_leaky_tool_reaches_neither_the_verifier_nor_the_answer_key_nor_the_initial_state(env, tmp_path):
    (task,) = generate(1, tmp_path / "bundles", seed=6, difficulty=1, categories=("inventory",))
    bundle = load_bundle(task.info["bundle"])
    (bundle.path / "tools.py").write_text((bundle.path / "tools.py").read_text() + LEAKY_TOOLS)
    (bundle.path / "tools.json").write_text(json.dumps(bundle.tools + LEAKY_SCHEMAS))
    initial = (bundle.path / "db.sqlite").read_bytes()
    env.reset(task)
    answer = bundle.task["reference"]["answer"]
    for name in ("verify.py", "task.json", "db.sqlite"):
        out = env.call("read_note", {"path": str(bundle.path / name)})
        assert out.startswith("error:") and answer not in out and "def verify" not in out, out
    assert env.call("read_note", {"path": "db.sqlite"}).startswith('"SQLite format')  # its own copy
    verifier = (bundle.path / "verify.py").read_bytes()
    for name in ("db.sqlite", "verify.py"):  # the state and the code the verifier reads
        # refused, or written to the sandbox's own empty view of that path: never the host's file
        env.call("write_note", {"path": str(bundle.path / name), "text": "x"})
    assert (bundle.path / "db.sqlite").read_bytes() == initial
    assert (bundle.path / "verify.py").read_bytes() == verifier
    assert env.reward(Episode([], answer)).value == 0.0
    episode = replay(env, task, env.reference(task))
    assert env.reward(episode).value == 1.0
