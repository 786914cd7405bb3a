"""``dsv32 envs serve``: the code interpreter over OpenEnv's protocol, driven by openenv-core's own
client on 127.0.0.1 — the reference episode scores what it scores natively, a wrong answer 0, bad
actions are error observations, sessions are bounded and each closes its environment."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("openenv", reason="openenv-core is not installed (pip install 'dsv32[openenv]')")

import httpx
from openenv.core import GenericEnvClient
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from dsv32.envs import get_env, replay, resolve_tasks
from dsv32.interop.openenv import ServerThread, build_app

TASK = resolve_tasks("code-interpreter", "smoke")[0]


@pytest.fixture(scope="module")
def server():
    with ServerThread(build_app("code-interpreter", tasks="smoke", max_sessions=2)) as s:
        yield s


def reference():
    env = get_env("code-interpreter").factory()
    try:
        replies = env.reference(TASK)
        native = env.reward(replay(env, TASK, replies)).value
    finally:
        env.close()
    return replies, native


def play(client, replies, final=None):
    """Each reference reply as OpenEnv actions: its tool calls, then the final answer."""
    for reply in replies[:-1]:
        for call in reply["tool_calls"]:
            function = call["function"]
            result = client.step(
                {"type": "call_tool", "tool_name": function["name"], "arguments": function["arguments"]}
            )
            assert not result.done and result.observation["error"] is None
    return client.step({"type": "final_answer", "content": final or replies[-1]["content"]})


def test_reference_episode_scores_as_natively_and_a_wrong_answer_scores_0(server):
    replies, native = reference()
    assert native == 1.0
    with GenericEnvClient(base_url=server.url).sync() as client:
        first = client.reset(task_id=TASK.id)
        assert first.done is False and first.reward is None
        observation = first.observation
        assert [m["role"] for m in observation["messages"]] == ["system", "user"]
        assert observation["messages"][1]["content"] == TASK.prompt
        assert [t["name"] for t in observation["tools"]] == ["python"]
        assert "code" in observation["tools"][0]["input_schema"]["properties"]
        assert TASK.answer not in json.dumps(observation)  # the answer stays on the server
        done = play(client, replies)
        assert (done.done, done.reward) == (True, native)
        assert done.observation["reward_components"] == {"boxed": 1.0, "correct": 1.0}
        state = client.state()
        assert (
            state["task_id"] == TASK.id and state["done"] and state["env_state"]["calls"][0]["status"] == "ok"
        )

        client.reset(task_id=TASK.id)  # a second episode in the same session
        wrong = play(client, replies, final="The answer is \\boxed{7}.")
        assert (wrong.done, wrong.reward) == (True, 0.0)
        assert "differs" in wrong.observation["reason"]


def test_bad_actions_are_error_observations_and_the_session_goes_on(server):
    with GenericEnvClient(base_url=server.url).sync() as client:
        early = client.step({"type": "call_tool", "tool_name": "python", "arguments": {"code": "1"}})
        assert early.observation["error"]["code"] == "no_episode"
        unknown_task = client.reset(task_id="no-such-task")
        assert unknown_task.done and unknown_task.observation["error"]["code"] == "unknown_task"

        client.reset(index=0)
        cases = {
            "unknown_tool": {"type": "call_tool", "tool_name": "shell", "arguments": {}},
            "bad_json": {"type": "call_tool", "tool_name": "python", "arguments": "{not json"},
            "invalid_arguments": {"type": "call_tool", "tool_name": "python", "arguments": {"cell": "1"}},
            "invalid_action": {"type": "final_answer"},
        }
        for code, action in cases.items():
            result = client.step(action)
            assert not result.done and result.observation["error"]["code"] == code, (code, result)
        with pytest.raises(
            RuntimeError, match="VALIDATION_ERROR"
        ):  # not an action at all: OpenEnv refuses it
            client.step({"type": "rm -rf"})
        ok = client.step({"type": "call_tool", "tool_name": "python", "arguments": {"code": "6 * 7"}})
        assert ok.observation["result"] == "42" and ok.observation["error"] is None
        tools = client.step({"type": "list_tools"}).observation["tools"]
        assert [t["name"] for t in tools] == ["python"]
        assert client.step({"type": "final_answer", "content": "\\boxed{42}"}).done
        after = client.step({"type": "final_answer", "content": "again"})
        assert after.observation["error"]["code"] == "episode_done"


def test_sessions_are_bounded_and_each_closes_its_environment():
    app = build_app("code-interpreter", tasks="smoke", max_sessions=1)
    catalog, built = app.state.catalog, []
    make_env = catalog.make_env

    def recording():
        built.append(make_env())
        return built[-1]

    catalog.make_env = recording
    with ServerThread(app) as server:
        first = GenericEnvClient(base_url=server.url).sync()
        first.connect()
        first.reset(index=0)
        first.step({"type": "call_tool", "tool_name": "python", "arguments": {"code": "x = 1"}})
        assert built[0].kernel is not None and built[0].kernel.alive()
        second = GenericEnvClient(base_url=server.url).sync()
        with pytest.raises((RuntimeError, ConnectionClosed), match="capacity"):  # which one: a race
            second.connect()
            second.reset(index=0)
        second.close()
        with connect(server.url.replace("http", "ws") + "/ws") as raw:  # the refusal, word for word
            refusal = json.loads(raw.recv(timeout=10))
            assert refusal["data"]["code"] == "CAPACITY_REACHED"
            assert "1/1 sessions" in refusal["data"]["message"]
        first.close()
        third = GenericEnvClient(base_url=server.url).sync()
        with third:
            third.reset(index=1)  # the slot is free again, in a fresh environment
            fresh = third.step(
                {"type": "call_tool", "tool_name": "python", "arguments": {"code": "print(x)"}}
            )
            assert "NameError" in fresh.observation["result"]
        assert built[0].kernel is None  # closed with its session
    assert len(built) == 2


def test_http_routes(server):
    schema = httpx.get(f"{server.url}/schema").json()
    assert "final_answer" in schema["action"]["properties"]["type"]["enum"]
    assert httpx.get(f"{server.url}/health").json()["status"] == "healthy"
    assert "code-interpreter" in httpx.get(f"{server.url}/metadata").json()["name"]
    first = httpx.post(f"{server.url}/reset", json={"task_id": TASK.id}).json()
    assert first["observation"]["tools"][0]["name"] == "python" and first["done"] is False
    stateless = httpx.post(
        f"{server.url}/step", json={"action": {"type": "final_answer", "content": "1"}}
    ).json()
    assert stateless["observation"]["error"]["code"] == "no_episode"


def test_serve_command_flags():
    from dsv32.cli import build_parser
    from dsv32.cli.envs import EnvsCliError, _options

    args = build_parser().parse_args(
        [
            "envs",
            "serve",
            "code-interpreter",
            "--port",
            "9000",
            "--max-sessions",
            "3",
            "--option",
            "cell_timeout_s=5",
        ]
    )
    assert (args.host, args.port, args.max_sessions) == ("127.0.0.1", 9000, 3)
    assert _options(args.option) == {"cell_timeout_s": 5}
    with pytest.raises(EnvsCliError, match="KEY=VALUE"):
        _options(["no-equals"])
