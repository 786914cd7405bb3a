"""General tool tasks: the bundle format, the sandboxed tools and verifier, the three generators, and
the golden check over every shipped bundle (reference → 1; untouched or wrong → 0)."""

import json
import random

import pytest

from dsv32.envs.base import EnvError, Episode, Task, get_env, replay, resolve_tasks
from dsv32.envs.general import GeneralToolEnv, generate, load_bundle, task_of
from dsv32.envs.general.tasks import GENERATORS, TASK_SETS


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DSV32_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture
def env():
    e = GeneralToolEnv()
    yield e
    e.close()


@pytest.mark.parametrize("name", list(TASK_SETS))
def test_golden_every_shipped_bundle(env, name):
    """Each shipped bundle's reference passes its verifier; the untouched database fails it, and so
    does an empty answer where the answer carries the result (inventory total, calendar slot)."""
    tasks = TASK_SETS[name]()
    assert {t.info["category"] for t in tasks} == set(GENERATORS)
    for task in tasks:
        out = env.check(task)
        assert out["failed_calls"] == [], task.id
        assert out["reference"]["passed"], (task.id, out["reference"]["reason"])
        assert not out["untouched"]["passed"], task.id
        if task.info["category"] != "trip":
            assert not out["empty_answer"]["passed"], task.id


def test_reference_episodes_through_the_tools(env):
    for task in resolve_tasks("general-tools", "smoke"):
        episode = replay(env, task, env.reference(task))
        reward = env.reward(episode)
        assert reward.value == 1.0, (task.id, reward.reason)
        assert all(c["ok"] for c in env.state()["calls"])
        env.reset(task)  # a fresh episode: nothing done yet
        assert env.reward(Episode([], episode.final)).value == 0.0


def test_a_lone_surrogate_in_an_argument_is_an_error_text(env):
    """UTF-8 cannot encode a lone surrogate (JSON's \\u escapes carry one): the call is refused
    before it runs, so no tool result echoes it back."""
    env.reset(resolve_tasks("general-tools", "smoke")[0])
    out = env.call("get_room_bookings", {"room": "\ud800", "day": "2025-01-01"})
    assert out.startswith("error:") and "surrogate" in out, out
    out.encode("utf-8")


def test_huge_model_input_is_an_error_text_or_a_scored_zero(env):
    """A tool argument or a final answer past the 128 KiB a program argument holds still reaches the
    sandboxed runner: the call is the tool's error text, the answer a scored 0."""
    env.reset(resolve_tasks("general-tools", "smoke")[0])
    name = env.tools()[0]["function"]["name"]
    out = env.call(name, {"x": "a" * 200_000})
    assert out.startswith("error: bad arguments for"), out[:200]
    reward = env.reward(Episode([], "x" * 200_000))
    assert reward.scored and reward.value == 0.0 and "the verifier failed" not in reward.reason, reward


def test_difficulty_grows(tmp_path):
    for category in GENERATORS:
        easy, hard = (
            load_bundle(
                GENERATORS[category](random.Random(0), d, f"{category}{d}", tmp_path / f"{category}{d}").path
            )
            for d in (1, 5)
        )
        assert easy.task["difficulty"] == 1 and hard.task["difficulty"] == 5
        assert len(hard.task["reference"]["calls"]) > len(easy.task["reference"]["calls"]), category
        assert hard.db.stat().st_size >= easy.db.stat().st_size


def test_trip_rules_are_enforced(env, tmp_path):
    (task,) = generate(1, tmp_path, seed=7, difficulty=3, categories=("trip",))
    plan = env.reference(task)[-2]["tool_calls"][0]
    days = json.loads(plan["function"]["arguments"])["days"]
    env.reset(task)
    hotels = json.loads(env.call("get_hotels_by_city", {"city": days[1]["city"]}))
    priciest = max(hotels, key=lambda h: h["price_per_night"])
    wrong = [days[0], {**days[1], "hotel_id": priciest["id"]}, *days[2:]]
    assert "submitted" in env.call("submit_itinerary", {"days": wrong})
    reward = env.reward(Episode([], "submitted"))
    assert reward.value == 0.0 and ("budget" in reward.reason or "day 2" in reward.reason)
    assert "submitted" in env.call("submit_itinerary", {"days": days})  # a resubmission replaces it
    assert env.reward(Episode([], "submitted")).value == 1.0


def test_inventory_wrong_total_and_tool_errors(env, tmp_path):
    (task,) = generate(1, tmp_path, seed=3, difficulty=2, categories=("inventory",))
    replies = env.reference(task)
    episode = replay(env, task, [*replies[:-1], {"role": "assistant", "content": "The total is 0.01."}])
    assert env.reward(episode).value == 0.0 and "total" in env.reward(episode).reason
    assert env.call("get_order", {"order_id": 999}).startswith("error: ValueError: no order")
    assert env.call("get_order", {"id": 1}).startswith("error: bad arguments")
    assert env.call("drop_tables", {}).startswith("error: unknown tool")


def test_bundle_code_runs_sandboxed(env, tmp_path):
    (task,) = generate(1, tmp_path, seed=1, difficulty=1, categories=("calendar",))
    bundle = load_bundle(task.info["bundle"])
    evil = bundle.path / "tools.py"
    evil.write_text(
        evil.read_text()
        + "\n\ndef list_people(db):\n    open('/etc/dsv32-evil', 'w')\n"
        + "\n\ndef list_rooms(db):\n    import socket\n    socket.create_connection(('127.0.0.1', 9), timeout=1)\n"
    )
    env.reset(task)
    assert "Read-only file system" in env.call("list_people", {}) or "Permission" in env.call(
        "list_people", {}
    )
    assert env.call("list_rooms", {}).startswith("error: ")
    assert (bundle.path / "db.sqlite").read_bytes() == (tmp_path / task.id / "db.sqlite").read_bytes()


def test_bad_bundles_are_typed_errors(env, tmp_path):
    with pytest.raises(EnvError, match=r"info\.bundle"):
        env.reset(Task("t", "do it"))
    with pytest.raises(EnvError, match="missing"):
        env.reset(Task("t", "do it", info={"bundle": str(tmp_path)}))
    with pytest.raises(EnvError, match="difficulty"):
        generate(1, tmp_path, difficulty=0)
    with pytest.raises(EnvError, match="categories"):
        generate(1, tmp_path, categories=("chess",))


def test_bundles_from_a_jsonl(tmp_path):
    (task,) = generate(1, tmp_path / "b", seed=4, categories=("inventory",))
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(task.to_dict()) + "\n")
    (loaded,) = resolve_tasks("general-tools", str(path))
    assert loaded == task_of(loaded.info["bundle"])
    env = get_env("general-tools").factory()
    try:
        assert env.reward(replay(env, loaded, env.reference(loaded))).value == 1.0
    finally:
        env.close()
