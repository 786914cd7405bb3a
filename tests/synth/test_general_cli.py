"""``dsv32 synth general|search|filter`` end to end through the real ``openai`` client against a stub
OpenAI-compatible server on 127.0.0.1 that plays realistic transcripts: concurrent episodes, dedup,
token and cost logs, resume (a second run sends no request), and the outputs load in their
environments."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dsv32.cli import main
from dsv32.envs.base import Task, load_tasks, replay
from dsv32.envs.general.env import GeneralToolEnv


class StubServer:
    """``POST /v1/chat/completions`` answered by ``reply(request) -> assistant message``; a reply of
    None is an HTTP 400 (which the client does not retry)."""

    def __init__(self, reply) -> None:
        self.reply, self.requests, self.lock = reply, [], threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stub.lock:
                    stub.requests.append(body)
                reply = stub.reply(body)
                if reply is None:
                    self.send_error(400, "the stub refuses this request")
                    return
                message = {"role": "assistant", **reply}
                calls = message.get("tool_calls") or []
                for i, call in enumerate(calls):
                    call.setdefault("id", f"call_{len(stub.requests)}_{i}")
                    call.setdefault("type", "function")
                data = json.dumps({
                    "id": "stub", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
                    "usage": {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100},
                }).encode()  # fmt: skip
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def spec(self, *options: str) -> str:
        return ",".join([f"openai:stub-model@http://127.0.0.1:{self.server.server_port}/v1", *options])


def _call(name: str, **arguments) -> dict:
    return {"tool_calls": [{"function": {"name": name, "arguments": json.dumps(arguments)}}]}


TOOLS = '''\
def list_books(db, author: str):
    """Books of an author: id, title, year, copies on the shelf."""
    return [dict(r) for r in db.execute("SELECT * FROM books WHERE author = ? ORDER BY id", (author,))]


def lend(db, book_id: str, reader: str):
    """Lend one copy of a book to a reader."""
    left = db.execute("SELECT copies FROM books WHERE id = ?", (book_id,)).fetchone()
    if left is None or left[0] < 1:
        raise ValueError("no copy left")
    db.execute("UPDATE books SET copies = copies - 1 WHERE id = ?", (book_id,))
    db.execute("INSERT INTO loans VALUES (?, ?)", (book_id, reader))
    return "lent"
'''
LIBRARY = [
    _call("bash", command=(
        "python3 - <<'EOF'\nimport sqlite3\ndb = sqlite3.connect('db.sqlite')\n"
        "db.execute('CREATE TABLE books (id TEXT, author TEXT, title TEXT, year INTEGER, copies INTEGER)')\n"
        "db.executemany('INSERT INTO books VALUES (?, ?, ?, ?, ?)', [('B1', 'Le Guin', 'The Dispossessed', 1974, 2),"
        " ('B2', 'Le Guin', 'The Lathe of Heaven', 1971, 0), ('B3', 'Le Guin', 'Lavinia', 2008, 1)])\n"
        "db.execute('CREATE TABLE loans (book_id TEXT, reader TEXT)')\ndb.commit()\ndb.close()\nEOF")),
    _call("write_file", path="tools.py", content=TOOLS),
    _call("write_file", path="solution.py", content=(
        "def solve(tools):\n    books = [b for b in tools.list_books('Le Guin') if b['copies'] > 0]\n"
        "    oldest = min(books, key=lambda b: b['year'])\n    tools.lend(oldest['id'], 'Ada')\n"
        "    return oldest['title']\n")),
    _call("write_file", path="verify.py", content=(
        "def verify(initial_db, final_db, answer):\n    loans = final_db.execute('SELECT * FROM loans').fetchall()\n"
        "    assert [tuple(r) for r in loans] == [('B1', 'Ada')], 'lend the oldest Le Guin on the shelf to Ada'\n"
        "    assert answer.strip() == 'The Dispossessed', 'name the book'\n    return True\n")),
    _call("submit_version", prompt="Lend Ada the oldest Le Guin book that has a copy on the shelf; name it."),
    {"content": "One version is enough for this test."},
]  # fmt: skip


def _replay_transcript(request: dict) -> dict:
    return dict(LIBRARY[sum(m["role"] == "assistant" for m in request["messages"])])


def test_synth_general_against_an_endpoint(tmp_path, capsys):
    out = tmp_path / "general"
    with StubServer(_replay_transcript) as stub:
        argv = ["synth", "general", "--category", "library loans", "--episodes", "2", "--workers", "2",
                "--generator", stub.spec("temperature=0.7", "price_in=0.28", "price_out=0.42"), "--out", str(out)]  # fmt: skip
        assert main(argv) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["jobs"] == 2 and summary["kept"] == 1 and summary["duplicates"] == 1
        assert len(stub.requests) == 2 * len(LIBRARY)
        assert stub.requests[0]["temperature"] == 0.7 and stub.requests[0]["tools"]
        assert summary["tokens"]["prompt_tokens"] == 2 * len(LIBRARY) * 1000
        cost = 2 * len(LIBRARY) * (1000 * 0.28 + 100 * 0.42) / 1e6
        assert summary["cost_usd"] == pytest.approx(cost) and summary["cost_per_kept_usd"] == pytest.approx(
            cost
        )
        assert main(argv) == 0  # resume: every job is done, nothing is sent
        assert len(stub.requests) == 2 * len(LIBRARY)
    (row,) = load_tasks(out / "tasks.jsonl")
    assert row.info["provenance"]["generators"]["generator"].startswith("stub-model@http://127.0.0.1")
    # the task carries its own episode's cost; the summary spreads the duplicate episode's over what was kept
    assert row.info["provenance"]["prompts_version"] and row.info["cost_usd"] == pytest.approx(cost / 2)
    with GeneralToolEnv() as env:
        assert env.reward(replay(env, row, env.reference(row))).value == 1.0
    assert '"kept": 1' in capsys.readouterr().out


CORPUS = [
    ("tern.Nest", "class tern.Nest(eggs=2)\nA nest on the shore. Watched by tern.Keeper."),
    ("tern.Keeper", "class tern.Keeper(tide='low')\nWatches nests near a cliff. Default tide is 'low'."),
    ("gull.Cliff", "class gull.Cliff(height=80)\nA cliff."),
]


def _search_roles(request: dict) -> dict:
    """Constructor, answer agents, verifier and rubric writer, told apart by their system prompts."""
    system = request["messages"][0]["content"]
    turn = sum(m["role"] == "assistant" for m in request["messages"])
    if "verifiable questions" in system:
        script = [_call("search", query="tern Nest"), _call("open", doc_id="tern.Keeper"),
                  _call("submit_qa", question="What is the default tide of the class that watches a tern.Nest?",
                        answer="'low'", evidence=["tern.Nest", "tern.Keeper"]), {"content": "done"}]  # fmt: skip
        return script[turn]
    if "check answers" in system:
        if turn:
            return {"content": "done"}
        listed = request["messages"][1]["content"].split("Answers:\n")[1].splitlines()
        verdicts = [
            {"index": i, "correct": line.endswith("'low'"), "reason": "tern.Keeper"}
            for i, line in enumerate(listed)
        ]
        return _call("submit_verdict", verdicts=verdicts)
    if "rubrics" in system:
        return {"content": json.dumps({"criteria": [{"name": "answer", "description": "says 'low'", "weight": 2},
                                                    {"name": "cites", "description": "cites tern.Keeper", "weight": 1}]})}  # fmt: skip
    return {"content": "Answer: 'high'"}  # every answer agent is wrong


def test_synth_search_and_filter_against_an_endpoint(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "title": i, "text": t}) + "\n" for i, t in CORPUS))
    with StubServer(_search_roles) as stub:
        argv = ["synth", "search", "--entities", "1", "--corpus", str(corpus), "--max-mentions", "1",
                "--constructor", stub.spec(), "--answerer", stub.spec("prompt=terse"),
                "--answerer", stub.spec("temperature=1.0", "prompt=careful"), "--verifier", stub.spec(),
                "--out", str(tmp_path / "search")]  # fmt: skip
        assert main(argv) == 0
        summary = json.loads((tmp_path / "search" / "summary.json").read_text())
        # tern.Nest is the one long-tail entity ("keeper" and "cliff" are named twice); both answer
        # agents say 'high', the verifier confirms 'low' and rejects 'high': kept, with its rubric
        assert summary["jobs"] == 1 and summary["kept"] == 1, summary
        (task,) = load_tasks(tmp_path / "search" / "tasks.jsonl")
        assert task.answer == "'low'" and task.info["entity"] == "tern.Nest"
        assert task.info["rubric"]["criteria"][0]["weight"] == pytest.approx(2 / 3)
        assert set(summary["provenance"]["generators"]) == {
            "constructor",
            "verifier",
            "rubric",
            "answerer0",
            "answerer1",
        }
        # pass@k filtering of search tasks with the same endpoint as the policy: it always answers 'high'
        rows = [
            Task("t-high", "Which tide? (tern)", "'high'", "search"),
            Task("t-low", "Which tide?", "'low'", "search"),
        ]
        path = tmp_path / "tasks.jsonl"
        path.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in rows))
        argv = ["synth", "filter", "--env", "search", "--env-option", f"corpus={corpus}", "--tasks", str(path),
                "--policy", stub.spec(), "--k", "2", "--n", "3", "--workers", "2", "--out", str(tmp_path / "filter")]  # fmt: skip
        assert main(argv) == 0
    report = json.loads((tmp_path / "filter" / "report.json").read_text())
    assert report["distribution"]["never_solved"] == 1 and report["distribution"]["always_solved"] == 1
    assert [t.id for t in load_tasks(tmp_path / "filter" / "tasks.jsonl")] == ["t-high"]
    assert "| 0.9-1.0 | 1 |" in (tmp_path / "filter" / "report.md").read_text()


def test_synth_filter_retries_endpoint_failures_and_resumes_only_with_its_own_settings(tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(Task("t-low", "Which tide?", "'low'", "search").to_dict()) + "\n")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "d", "title": "d", "text": "filler"}) + "\n")
    up = threading.Event()
    out = tmp_path / "filter"
    with StubServer(lambda request: {"content": "Answer: 'low'"} if up.is_set() else None) as stub:
        argv = ["synth", "filter", "--env", "search", "--env-option", f"corpus={corpus}", "--tasks", str(tasks),
                "--policy", stub.spec(), "--k", "1", "--out", str(out)]  # fmt: skip
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(
            "dsv32 synth filter: 1 job(s) failed (first: t-low: task 't-low': sample 1 got no"
        )
        assert "HTTP 400" in err and "run the same command again to retry them" in err
        (row,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        assert row["status"] == "error" and not (out / "tasks.jsonl").exists()
        assert main([*argv, "--k", "2", "--n", "2"]) == 2
        assert "holds a filter run with other settings (k 1 -> 2; n 1 -> 2)" in capsys.readouterr().err
        up.set()
        assert main(argv) == 0
    assert [t.id for t in load_tasks(out / "tasks.jsonl")] == ["t-low"]
    assert json.loads((out / "summary.json").read_text())["jobs_with_errors"] == 0
