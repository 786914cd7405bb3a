"""The general-agent synthesis loop with a scripted synthesizing agent that plays a realistic
transcript: it writes a data script and runs it with bash, writes tools, a solution and a verifier,
submits, repairs a rejected version, escalates (adding a tool) and tries a version that is not
harder. The kept versions must be bundles the ``general-tools`` environment loads and scores 1."""

from __future__ import annotations

import json
import sqlite3

import pytest

from dsv32.agent import ScriptedBackend
from dsv32.envs.base import Task, replay
from dsv32.envs.general.env import GeneralToolEnv
from dsv32.synth.general import GeneralConfig, synthesize
from dsv32.synth.versions import solution_problems

MAKE_DB = """\
import sqlite3
db = sqlite3.connect("db.sqlite")
db.execute("CREATE TABLE hotels (id TEXT PRIMARY KEY, city TEXT, price INTEGER, rating REAL)")
db.executemany("INSERT INTO hotels VALUES (?, ?, ?, ?)", [
    ("H1", "Paris", 120, 3.1), ("H2", "Paris", 180, 4.4), ("H3", "Paris", 240, 4.8),
    ("H4", "Lyon", 90, 4.0), ("H5", "Paris", 210, 4.1),
])
db.execute("CREATE TABLE bookings (hotel_id TEXT)")
db.commit()
db.close()
"""

TOOLS_V1 = '''\
def hotels_in(db, city: str):
    """Hotels of a city: id and price per night."""
    return [dict(r) for r in db.execute("SELECT id, price FROM hotels WHERE city = ? ORDER BY id", (city,))]


def book(db, hotel_id: str):
    """Book a hotel by id (replaces an earlier booking)."""
    if db.execute("SELECT 1 FROM hotels WHERE id = ?", (hotel_id,)).fetchone() is None:
        raise ValueError(f"no hotel {hotel_id}")
    db.execute("DELETE FROM bookings")
    db.execute("INSERT INTO bookings VALUES (?)", (hotel_id,))
    return "booked"
'''

TOOLS_V2 = (
    TOOLS_V1
    + '''

def hotel_details(db, hotel_id: str):
    """A hotel's id, city, price and rating."""
    row = db.execute("SELECT * FROM hotels WHERE id = ?", (hotel_id,)).fetchone()
    if row is None:
        raise ValueError(f"no hotel {hotel_id}")
    return dict(row)
'''
)

SOLUTION_V1 = """\
def solve(tools):
    hotels = tools.hotels_in("Paris")
    best = min(hotels, key=lambda h: h["price"])
    tools.book(best["id"])
    return "Booked " + best["id"]
"""

SOLUTION_V2_WRONG = """\
def solve(tools):
    hotels = [tools.hotel_details(h["id"]) for h in tools.hotels_in("Paris")]
    best = max(hotels, key=lambda h: h["price"])
    tools.book(best["id"])
    return "Booked " + best["id"]
"""

SOLUTION_V2 = """\
def solve(tools):
    hotels = [tools.hotel_details(h["id"]) for h in tools.hotels_in("Paris")]
    good = [h for h in hotels if h["rating"] >= 4.0]
    best = min(good, key=lambda h: h["price"])
    tools.book(best["id"])
    return "Booked " + best["id"]
"""

VERIFY = """\
def verify(initial_db, final_db, answer):
    rows = final_db.execute("SELECT hotel_id FROM bookings").fetchall()
    assert len(rows) == 1, "exactly one hotel must be booked"
    hotel = initial_db.execute("SELECT * FROM hotels WHERE id = ?", (rows[0]["hotel_id"],)).fetchone()
    assert hotel is not None and hotel["city"] == "Paris", "the booked hotel is not in Paris"
    cheapest = initial_db.execute(
        "SELECT MIN(price) FROM hotels WHERE city = 'Paris' AND rating >= ?", (MIN_RATING,)
    ).fetchone()[0]
    assert hotel["rating"] >= MIN_RATING, f"the hotel is rated below {MIN_RATING}"
    assert hotel["price"] == cheapest, "a cheaper hotel meets the conditions"
    return True
"""


def _verify(min_rating: float) -> str:
    return f"MIN_RATING = {min_rating}\n\n" + VERIFY


def _call(name: str, **arguments) -> dict:
    return {
        "reasoning_content": f"I will call {name}.",
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}],
    }


def _write(path: str, content: str) -> dict:
    return _call("write_file", path=path, content=content)


TRANSCRIPT = [
    _write("make_db.py", MAKE_DB),
    _call("bash", command="python3 make_db.py && sqlite3 db.sqlite 'SELECT COUNT(*) FROM hotels' || true"),
    _write("tools.py", TOOLS_V1),
    _write("solution.py", SOLUTION_V1),
    _write("verify.py", _verify(0.0)),
    _call("submit_version", prompt="Book the cheapest hotel in Paris, then say which one you booked."),
    # escalation: a rating condition the current tools cannot see, so a tool is added
    _write("tools.py", TOOLS_V2),
    _write("solution.py", SOLUTION_V2_WRONG),
    _write("verify.py", _verify(4.0)),
    _call("submit_version", prompt="Book the cheapest hotel in Paris rated at least 4.0."),
    _write("solution.py", SOLUTION_V2),  # the repair
    _call("submit_version", prompt="Book the cheapest hotel in Paris rated at least 4.0."),
    # a rewording with the same constraints: the previous solution still passes, so not harder
    _call(
        "submit_version",
        prompt="Find the least expensive Paris hotel with a rating of 4.0 or more and book it.",
    ),
    {"reasoning_content": "I cannot make it harder with this data.", "content": "Done: two versions."},
]


@pytest.fixture(scope="module")
def episode(tmp_path_factory):
    staging = tmp_path_factory.mktemp("staging")
    backend = ScriptedBackend(TRANSCRIPT)
    result = synthesize(backend, GeneralConfig("hotel booking", max_versions=3), "e0", staging,
                        provenance={"generators": {"generator": "scripted"}})  # fmt: skip
    return result, backend


def test_the_loop_keeps_valid_versions_and_rejects_the_others(episode):
    result, backend = episode
    assert backend.remaining == 0
    subs = result.stats["submissions"]
    assert [(s["index"], s["accepted"]) for s in subs] == [(1, True), (2, False), (2, True), (3, False)]
    assert "fails its verifier" in subs[1]["reason"] and "more expensive" not in subs[1]["reason"]
    assert "a cheaper hotel meets the conditions" in subs[1]["reason"]
    assert subs[3]["reason"].startswith("not harder: the previous version's solution still passes")
    assert result.stats["accepted_versions"] == 2 and result.stats["stop_reason"] == "answer"
    assert [item.task["info"]["difficulty"] for item in result.items] == [1, 2]
    assert result.items[1].task["info"]["harder"] == "the previous version's solution fails the new verifier"
    system = backend.calls[0].messages[0]["content"]
    assert (
        "import only bisect, collections" in system
        and "hotel booking" in backend.calls[0].messages[1]["content"]
    )
    # the agent read each verdict as a tool result
    tool_texts = [m["content"] for m in backend.calls[-1].messages if m["role"] == "tool"]
    assert any(t.startswith("version 1 accepted") for t in tool_texts)
    assert any(t.startswith("version 2 rejected") for t in tool_texts)


def test_kept_versions_are_general_tools_bundles_that_score_1(episode):
    result, _ = episode
    for item in result.items:
        bundle = item.artifact
        task_json = json.loads((bundle / "task.json").read_text())
        assert task_json["category"] == "hotel booking" and task_json["provenance"]["generators"]
        assert {t["function"]["name"] for t in json.loads((bundle / "tools.json").read_text())} >= {
            "hotels_in",
            "book",
        }
        task = Task(item.task["id"], item.task["prompt"], info={"bundle": str(bundle)})
        with GeneralToolEnv() as env:
            assert env.reward(replay(env, task, env.reference(task))).value == 1.0
            # a wrong plan (the cheapest Paris hotel, rated 3.1) fails version 2 and passes version 1
            wrong = [{"role": "assistant", "content": "", "tool_calls": [
                {"id": "w", "type": "function", "function": {"name": "book", "arguments": '{"hotel_id": "H1"}'}}]},
                {"role": "assistant", "content": "Booked H1"}]  # fmt: skip
            expected = 1.0 if task_json["difficulty"] == 1 else 0.0
            assert env.reward(replay(env, task, wrong)).value == expected
    v2 = json.loads((result.items[1].artifact / "task.json").read_text())
    assert [c["name"] for c in v2["reference"]["calls"]].count("hotel_details") == 4
    assert v2["reference"]["answer"] == "Booked H2"
    with sqlite3.connect(result.items[1].artifact / "db.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM bookings").fetchone()[0] == 0  # the initial state


def test_an_episode_without_an_accepted_version_keeps_nothing(tmp_path):
    transcript = [
        _write("make_db.py", MAKE_DB),
        _call("bash", command="python3 make_db.py"),
        _write("tools.py", TOOLS_V1),
        _write("solution.py", "import sqlite3\n\ndef solve(tools):\n    return 'x'\n"),
        _write("verify.py", _verify(0.0)),
        _call("submit_version", prompt="Book the cheapest hotel in Paris."),
        _write("solution.py", "def solve(tools):\n    return 'nothing'\n"),
        _write("verify.py", "def verify(initial_db, final_db, answer):\n    return True\n"),
        _call("submit_version", prompt="Book the cheapest hotel in Paris."),
        {"content": "I give up."},
    ]
    result = synthesize(ScriptedBackend(transcript), GeneralConfig("hotel booking"), "e1", tmp_path)
    reasons = [s["reason"] for s in result.stats["submissions"]]
    assert "import of 'sqlite3'" in reasons[0]
    assert "calls no tool" in reasons[1]
    assert result.items == [] and result.dropped[0]["reason"] == "no accepted version"


def test_solution_rules():
    assert solution_problems(SOLUTION_V2) == []
    bad = "import os\nfrom sqlite3 import connect\n\ndef solve(tools):\n    open('db.sqlite')\n    return tools._functions\n"
    problems = " | ".join(solution_problems(bad))
    for needle in (
        "import of 'os'",
        "import of 'sqlite3'",
        "open is not allowed",
        "private attribute ._functions",
    ):
        assert needle in problems
    assert solution_problems("def other(tools):\n    pass\n") == [
        "solution.py must define solve(tools) at module level"
    ]


def test_a_version_file_that_is_a_link_is_refused_without_reading_its_target(tmp_path):
    from dsv32.synth.versions import Limits
    from dsv32.synth.workspace import Workspace

    outside = tmp_path / "host"
    outside.mkdir()
    (outside / "tools.py").write_text(TOOLS_V1 + "\nSECRET = 'host-only-3141'\n")
    ws = Workspace.create(limits=Limits(timeout_s=20))
    try:
        ws.write_file("make_db.py", MAKE_DB)
        ws.bash("python3 make_db.py")
        ws.write_file("solution.py", SOLUTION_V1)
        ws.write_file("verify.py", _verify(0.0))
        (ws.work / "tools.py").symlink_to(outside / "tools.py")
        text = ws.submit_version("Book the cheapest hotel in Paris.")
        assert text.startswith("version 1 rejected: tools.py is a symbolic link") and "3141" not in text
        (ws.work / "tools.py").unlink()
        (ws.work / "tools.py").mkdir()
        assert "tools.py is not a regular file" in ws.submit_version("Book the cheapest hotel.")
        assert ws.versions == [] and list((ws.root / "versions").iterdir()) == []
    finally:
        ws.close()


def test_a_generator_that_fails_before_any_version_is_an_error_not_a_drop(tmp_path):
    from dsv32.synth.records import JobFailed

    start = [_write("make_db.py", MAKE_DB), _call("bash", command="python3 make_db.py")]
    with pytest.raises(
        JobFailed, match="the generator failed before any version was accepted: the script"
    ) as err:
        synthesize(
            ScriptedBackend(start), GeneralConfig("hotel booking"), "e2", tmp_path / "a"
        )  # reply 3 fails
    assert err.value.usage.roles["generator"].calls == 2
    # a local generator's failure (a full window) is the same on every run: dropped
    result = synthesize(ScriptedBackend(start), GeneralConfig("hotel booking"), "e2", tmp_path / "b",
                        retry_errors=False)  # fmt: skip
    assert result.dropped == [{"reason": "no accepted version", "stop_reason": "error"}]
    # a version accepted before the failure is a checked task: kept
    result = synthesize(ScriptedBackend(TRANSCRIPT[:6]), GeneralConfig("hotel booking"), "e3", tmp_path / "c")
    assert [i.task["info"]["difficulty"] for i in result.items] == [1] and result.stats[
        "stop_reason"
    ] == "error"


def _hotel_workspace(verify: str):
    """A workspace holding the hotel database, the first version's tools and solution, and ``verify``."""
    from dsv32.synth.versions import Limits
    from dsv32.synth.workspace import Workspace

    ws = Workspace.create(limits=Limits(timeout_s=20))
    ws.write_file("make_db.py", MAKE_DB)
    ws.bash("python3 make_db.py")
    ws.write_file("tools.py", TOOLS_V1)
    ws.write_file("solution.py", SOLUTION_V1)
    ws.write_file("verify.py", verify)
    return ws


def test_a_verifier_that_accepts_any_answer_on_the_untouched_database_is_too_weak():
    ws = _hotel_workspace("def verify(initial_db, final_db, answer):\n    return bool(answer.strip())\n")
    try:
        assert ws.submit_version("Book the cheapest hotel in Paris.") == (
            "version 1 rejected: the verifier is too weak: it accepts an episode that called no tool "
            "and answered 'I could not complete the task.'"
        )
    finally:
        ws.close()


def test_the_verifier_gets_an_answer_of_any_size(tmp_path):
    from dsv32.synth.versions import Limits, run_verifier

    code = tmp_path / "code"
    code.mkdir()
    (code / "verify.py").write_text(
        "def verify(initial_db, final_db, answer):\n    return len(answer) == 300_000\n"
    )
    dbs = tmp_path / "dbs"
    dbs.mkdir()
    for name in ("initial.sqlite", "final.sqlite"):
        sqlite3.connect(dbs / name).close()
    out = run_verifier(
        code, dbs / "initial.sqlite", dbs / "final.sqlite", "x" * 300_000, Limits(timeout_s=20)
    )
    assert out == {"ok": True, "passed": True, "reason": "the verifier accepted the result"}  # > 128 KiB argv


def test_a_version_that_renames_a_tool_is_not_harder():
    from dsv32.synth.versions import tool_changes

    ws = _hotel_workspace(_verify(0.0))
    try:
        assert ws.submit_version("Book the cheapest hotel in Paris.").startswith("version 1 accepted")
        # the same task under new tool names: the old solution fails only for calling what is gone
        ws.write_file("tools.py", TOOLS_V1.replace("hotels_in", "list_hotels").replace("hotel_id", "hid"))
        ws.write_file("solution.py", SOLUTION_V1.replace("hotels_in", "list_hotels"))
        text = ws.submit_version("Book the cheapest Paris hotel and tell me which.")
        assert text.startswith(
            "version 2 rejected: not harder: it changes the previous version's tools (book lost "
            "parameter hotel_id; book gained required parameter hid; tool hotels_in was removed)"
        )
        # added tools and optional parameters break nothing
        tools = ws.versions[0].tools
        extra = {"type": "function", "function": {"name": "more", "parameters": {
            "type": "object", "properties": {}, "required": []}}}  # fmt: skip
        widened = json.loads(json.dumps(tools))
        widened[0]["function"]["parameters"]["properties"]["limit"] = {"type": "integer"}
        assert tool_changes(tools, [*widened, extra]) == []
        widened[0]["function"]["parameters"]["properties"]["hotel_id"] = {"type": "integer"}
        assert tool_changes(tools, widened) == ["book.hotel_id changed type"]
    finally:
        ws.close()
